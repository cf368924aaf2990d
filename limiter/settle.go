package limiter

import (
	"context"
	"math"
	"slices"
	"strconv"
	"time"
)

// Settling a charge after the response (Store.Refund and Store.Charge):
// a request may be checked and charged before it goes on (Take), then
// given back part of its charge (a refund: the response did not count),
// or charged more (a charge: the response said what it cost).

// MaxDebt bounds how far a Charge may put a bucket into debt: its TAT is
// at most MaxDebt beyond the time it would be full (token bucket) or its
// queue empty (leaky bucket) without the debt.
const MaxDebt = 30 * 24 * time.Hour

// Debt reports whether the algorithm can go into debt: whether Charge
// charges it.
func (a Algorithm) Debt() bool { return a == TokenBucket || a == LeakyBucket }

// Refund is RefundAt with the current time; it never fails.
func (s *MemoryStore) Refund(_ context.Context, reqs []Request, taken []Decision) ([]Decision, error) {
	return s.RefundAt(time.Now(), reqs, taken), nil
}

// RefundAt gives back at now what the takes of reqs, which decided taken,
// still hold back (see Store.Refund).
func (s *MemoryStore) RefundAt(now time.Time, reqs []Request, taken []Decision) []Decision {
	decisions := make([]Decision, len(reqs))
	for i, r := range reqs {
		cost := boundedCost(r.Cost)
		if !taken[i].Allowed { // a refused take charged nothing
			cost = 0
		}
		decisions[i] = s.update(r, func(b bucket, known bool) (bucket, Decision) {
			return r.Policy.refund(b, known, now.UnixNano(), taken[i].At.UnixNano(), taken[i].Reset.UnixNano(), cost)
		})
		decisions[i].At = now
	}
	return decisions
}

// Charge is ChargeAt with the current time; it never fails.
func (s *MemoryStore) Charge(_ context.Context, reqs []Request) ([]Decision, error) {
	return s.ChargeAt(time.Now(), reqs), nil
}

// ChargeAt charges reqs at now, into debt if need be (see Store.Charge).
func (s *MemoryStore) ChargeAt(now time.Time, reqs []Request) []Decision {
	decisions := make([]Decision, len(reqs))
	for i, r := range reqs {
		decisions[i] = s.update(r, func(b bucket, known bool) (bucket, Decision) {
			return r.Policy.charge(b, known, now.UnixNano(), boundedCost(r.Cost))
		})
		decisions[i].At = now
	}
	return decisions
}

// update replaces r's bucket, under its shard's lock, with what f makes
// of it, and returns f's decision. A bucket f leaves unknown is dropped.
func (s *MemoryStore) update(r Request, f func(b bucket, known bool) (bucket, Decision)) Decision {
	k := bucketIDOf(r)
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b, known := sh.get(k)
	nb, d := f(b, known)
	if nb.idleAt == 0 { // nothing to keep
		sh.drop(k)
	} else {
		sh.put(k, nb)
	}
	return d
}

// refund gives back at now what cost of the charge of a take still holds
// back (see Store.Refund): the take decided at at, and its charge ended at
// end (its decision's Reset). It returns the bucket to keep (the zero
// bucket: none) and its state at now. It never changes b's log in place
// (a Peek may read it).
//
// A GCRA's charges queue on its TAT in the order of their takes and drain
// at the rate, in real time: the charge that ended the TAT at end still
// holds back min(cost intervals, end - now), the part of it not yet
// drained; that much comes off the TAT, never back before now. What has
// drained (the bucket refilled since, up to its cap) is no one's to give
// back: a later request charged it again.
//
// The decision is the bucket's state, as Redis tells it: allowed, with no
// retry and no delay, whatever a request would meet.
func (p Policy) refund(b bucket, known bool, now, at, end, cost int64) (bucket, Decision) {
	b, d := p.giveBack(b, known, now, at, end, cost)
	d.Allowed, d.RetryAfter, d.Delay = true, 0, 0
	return b, d
}

func (p Policy) giveBack(b bucket, known bool, now, at, end, cost int64) (bucket, Decision) {
	known = known && b.idleAt > now
	if !known || cost == 0 || p.Algorithm == Concurrency { // nothing left of the charge
		_, d := p.take(b, known, now, 0)
		return b, d
	}
	period := int64(p.Period)
	switch p.Algorithm {
	case TokenBucket, LeakyBucket:
		g := p.gcra(b, known, now)
		held := min(float64(cost)*g.interval, max(float64(end-now), 0))
		keep, wait := g.settle(now, max(g.wait-held, 0))
		b = bucket{last: keep, idleAt: now + nanosUp(wait)}
	case FixedWindow: // while the take's window lasts
		if b.last == at/period && at/period == now/period {
			b.tokens = max(b.tokens-float64(cost), 0)
		}
	case SlidingWindowCounter:
		switch b.last {
		case at / period: // the take's window's count
			b.tokens = max(b.tokens-float64(cost), 0)
		case at/period + 1: // the window has turned: the charge is in the previous count
			b.prev = max(b.prev-float64(cost), 0)
		}
	case SlidingWindowLog: // the take's entries, if they are still in the log
		b.log = unlog(b.log, at, cost)
	}
	_, d := p.take(b, true, now, 0)
	return b, d
}

// unlog is log without up to cost entries of the time at (the newest of
// them), in a new slice.
func unlog(log []int64, at, cost int64) []int64 {
	lo, _ := slices.BinarySearch(log, at)
	hi, _ := slices.BinarySearch(log, at+1)
	n := min(int64(hi-lo), cost)
	return slices.Concat(log[:hi-int(n)], log[hi:])
}

// charge charges cost at now, whatever the bucket holds, up to MaxDebt
// beyond its burst (see Store.Charge); algorithms without debt are left
// alone, with a zero decision (not asked), as in Redis. It returns the
// bucket to keep and its state after the charge.
func (p Policy) charge(b bucket, known bool, now, cost int64) (bucket, Decision) {
	if !p.Algorithm.Debt() {
		return b, Decision{}
	}
	g := p.gcra(b, known && b.idleAt > now, now)
	wait := min(g.wait+float64(cost)*g.interval, g.full+float64(MaxDebt))
	keep, wait := g.settle(now, wait)
	d := Decision{Allowed: true, Limit: p.Limit(), Reset: at(now + nanosUp(wait)),
		Remaining: max(int64(math.Floor((g.room-wait)/g.interval)), 0)}
	if p.Algorithm == LeakyBucket { // one place at the rate, the rest in the queue
		d.Remaining = max(int64(math.Floor((g.room-wait)/g.interval))+1, 0)
	}
	return bucket{last: keep, idleAt: now + nanosUp(wait)}, d
}

// Refund gives back on the server's clock what the takes of reqs, which
// decided taken, still hold back (see Store.Refund), in one round trip.
func (s *RedisStore) Refund(ctx context.Context, reqs []Request, taken []Decision) ([]Decision, error) {
	return s.refundAt(ctx, "", reqs, taken)
}

// RefundAt is Refund at an explicit time instead of the server's clock.
func (s *RedisStore) RefundAt(ctx context.Context, now time.Time, reqs []Request, taken []Decision) ([]Decision, error) {
	return s.refundAt(ctx, strconv.FormatInt(now.UnixMicro(), 10), reqs, taken)
}

// refundAt refunds reqs at now (Unix µs in decimal; "" for the server's
// clock). Each key's flag is its take's (see takenFlag).
func (s *RedisStore) refundAt(ctx context.Context, now string, reqs []Request, taken []Decision) ([]Decision, error) {
	decisions := make([]Decision, len(reqs))
	var idx []int
	flags := make([]string, len(reqs))
	for i, r := range reqs {
		if r.Policy.Algorithm == Concurrency || r.Cost <= 0 || !taken[i].Allowed {
			continue
		}
		idx = append(idx, i)
		flags[i] = takenFlag(taken[i].At.UnixMicro(), taken[i].Reset.UnixMicro())
	}
	if len(idx) == 0 {
		return decisions, nil
	}
	return decisions, s.settle(ctx, now, "refund", reqs, idx, flags, decisions)
}

// takenFlag is the flag a key's script is given in refund mode, in place
// of the take's (the leaky bucket's nodelay, which a refund does not
// read): "<at>:<end>", the time of the take's decision and the end of its
// charge (the decision's Reset), in Unix µs. See taken in common.lua.
func takenFlag(at, end int64) string {
	return strconv.FormatInt(at, 10) + ":" + strconv.FormatInt(end, 10)
}

// Charge charges reqs on the server's clock (see Store.Charge).
func (s *RedisStore) Charge(ctx context.Context, reqs []Request) ([]Decision, error) {
	return s.charge(ctx, "", reqs)
}

// ChargeAt is Charge at an explicit time instead of the server's clock.
func (s *RedisStore) ChargeAt(ctx context.Context, now time.Time, reqs []Request) ([]Decision, error) {
	return s.charge(ctx, strconv.FormatInt(now.UnixMicro(), 10), reqs)
}

func (s *RedisStore) charge(ctx context.Context, now string, reqs []Request) ([]Decision, error) {
	decisions := make([]Decision, len(reqs))
	var idx []int
	for i, r := range reqs {
		if r.Policy.Algorithm.Debt() && r.Cost > 0 {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return decisions, nil
	}
	return decisions, s.settle(ctx, now, "charge", reqs, idx, nil, decisions)
}

// settle runs the scripts in mode ("refund", "charge") at now for the
// requests idx of reqs, with the flags of reqs (refunds; nil: the
// requests' own), and fills their decisions.
func (s *RedisStore) settle(ctx context.Context, now, mode string, reqs []Request, idx []int, flags []string, decisions []Decision) error {
	sub := make([]Request, len(idx))
	for j, i := range idx {
		sub[j] = reqs[i]
	}
	runs := s.scriptRuns(sub)
	if flags != nil {
		for r := range runs {
			runs[r].flags = make([]string, len(runs[r].idx))
			for j, i := range runs[r].idx {
				runs[r].flags[j] = flags[idx[i]]
			}
		}
	}
	if err := s.run(ctx, runs, now, mode, sub); err != nil {
		s.reloadTopology(err)
		return err
	}
	d := make([]Decision, len(sub))
	for i, sr := range runs {
		if _, err := decode(runs[i].reply, sr.idx, sub, d); err != nil {
			return err
		}
	}
	for j, i := range idx {
		decisions[i] = d[j]
	}
	return nil
}
