package memstore

import (
	"context"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Refund is RefundAt with the current time; it never fails.
func (s *Store) Refund(_ context.Context, reqs []bucket.Request, taken []bucket.Decision) ([]bucket.Decision, error) {
	return s.RefundAt(time.Now(), reqs, taken), nil
}

// RefundAt gives back at now what the takes of reqs, which decided taken,
// still hold back (see Store.Refund).
func (s *Store) RefundAt(now time.Time, reqs []bucket.Request, taken []bucket.Decision) []bucket.Decision {
	decisions := make([]bucket.Decision, len(reqs))
	for i, r := range reqs {
		cost := bucket.BoundedCost(r.Cost)
		if !taken[i].Allowed { // a refused take charged nothing
			cost = 0
		}
		decisions[i] = s.update(r, func(b bucket.State, known bool) (bucket.State, bucket.Decision) {
			return r.Policy.Refund(b, known, now.UnixNano(), taken[i].At.UnixNano(), taken[i].Reset.UnixNano(), cost)
		})
		decisions[i].At = now
	}
	return decisions
}

// Charge is ChargeAt with the current time; it never fails.
func (s *Store) Charge(_ context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	return s.ChargeAt(time.Now(), reqs), nil
}

// ChargeAt charges reqs at now, into debt if need be (see Store.Charge).
func (s *Store) ChargeAt(now time.Time, reqs []bucket.Request) []bucket.Decision {
	decisions := make([]bucket.Decision, len(reqs))
	for i, r := range reqs {
		decisions[i] = s.update(r, func(b bucket.State, known bool) (bucket.State, bucket.Decision) {
			return r.Policy.Charge(b, known, now.UnixNano(), bucket.BoundedCost(r.Cost))
		})
		decisions[i].At = now
	}
	return decisions
}

// update replaces r's bucket, under its shard's lock, with what f makes
// of it, and returns f's decision. A bucket f leaves unknown is dropped.
func (s *Store) update(r bucket.Request, f func(b bucket.State, known bool) (bucket.State, bucket.Decision)) bucket.Decision {
	k := bucket.IDOf(r)
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b, known := sh.get(k)
	nb, d := f(b, known)
	if nb.IdleAt == 0 { // nothing to keep
		sh.drop(k)
	} else {
		sh.put(k, nb)
	}
	return d
}
