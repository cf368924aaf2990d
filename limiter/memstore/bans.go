package memstore

import (
	"context"
	"sync"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// memBans are the bans of a Store.
type memBans struct {
	mu      sync.Mutex
	clients map[bucket.ID]banState
}

type banState struct {
	refusals    int64
	windowEnd   int64 // Unix ns: when the refusals counted so far are forgotten
	bannedUntil int64
}

// BannedAt is Banned at an explicit time.
func (s *Store) BannedAt(now time.Time, reqs []bucket.Request) []time.Duration {
	left := make([]time.Duration, len(reqs))
	s.bans.mu.Lock()
	defer s.bans.mu.Unlock()
	for i, r := range reqs {
		if r.Policy.Ban.After == 0 {
			continue
		}
		if st, ok := s.bans.clients[bucket.IDOf(r)]; ok && st.bannedUntil > now.UnixNano() {
			left[i] = time.Duration(st.bannedUntil - now.UnixNano())
		}
	}
	return left
}

// Banned is BannedAt now; it never fails.
func (s *Store) Banned(_ context.Context, reqs []bucket.Request) ([]time.Duration, error) {
	return s.BannedAt(time.Now(), reqs), nil
}

// RefusedAt is Refused at an explicit time.
func (s *Store) RefusedAt(now time.Time, r bucket.Request) (time.Duration, bool) {
	b := r.Policy.Ban
	if b.After == 0 {
		return 0, false
	}
	ns := now.UnixNano()
	s.bans.mu.Lock()
	defer s.bans.mu.Unlock()
	k := bucket.IDOf(r)
	st := s.bans.clients[k]
	if st.bannedUntil > ns {
		return time.Duration(st.bannedUntil - ns), false
	}
	if st.windowEnd <= ns {
		st = banState{windowEnd: ns + int64(b.Within)}
	}
	st.refusals++
	started := st.refusals >= b.After
	if started {
		st = banState{bannedUntil: ns + int64(b.For)}
	}
	s.bans.clients[k] = st
	return time.Duration(max(st.bannedUntil-ns, 0)), started
}

// Refused is RefusedAt now; it never fails.
func (s *Store) Refused(_ context.Context, r bucket.Request) (time.Duration, bool, error) {
	left, started := s.RefusedAt(time.Now(), r)
	return left, started, nil
}

// sweepBans drops what has expired.
func (s *Store) sweepBans(now int64) {
	s.bans.mu.Lock()
	defer s.bans.mu.Unlock()
	for k, st := range s.bans.clients {
		if st.bannedUntil <= now && st.windowEnd <= now {
			delete(s.bans.clients, k)
		}
	}
}
