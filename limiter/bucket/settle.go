package bucket

import (
	"math"
	"slices"
	"time"
)

// Debt reports whether the algorithm can go into debt: whether Charge
// charges it.
func (a Algorithm) Debt() bool { return specOf(a).debt }

// Refund gives back at now what cost of the charge of a take still holds
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
func (p Policy) Refund(b State, known bool, now, at, end, cost int64) (State, Decision) {
	b, d := p.giveBack(b, known, now, at, end, cost)
	d.Allowed, d.RetryAfter, d.Delay = true, 0, 0
	return b, d
}

func (p Policy) giveBack(b State, known bool, now, at, end, cost int64) (State, Decision) {
	known = known && b.IdleAt > now
	if !known || cost == 0 || p.Algorithm == Concurrency { // nothing left of the charge
		_, d := p.Take(b, known, now, 0)
		return b, d
	}
	period := int64(p.Period)
	switch p.Algorithm {
	case TokenBucket, LeakyBucket:
		g := p.GCRA(b, known, now)
		held := min(float64(cost)*g.interval, max(float64(end-now), 0))
		keep, wait := g.roundTAT(now, max(g.Wait-held, 0))
		b = State{last: keep, IdleAt: now + nanosUp(wait)}
	case FixedWindow: // while the take's window lasts
		if b.last == at/period && at/period == now/period {
			b.tokens = max(b.tokens-float64(cost), 0)
		}
	case Quota: // while the take's period lasts
		if s, _ := p.Calendar.Bounds(time.Unix(0, at)); b.last == s.UnixNano() && s.Equal(p.periodStart(now)) {
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
	_, d := p.Take(b, true, now, 0)
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

// Charge charges cost at now, whatever the bucket holds, up to MaxDebt
// beyond its burst (see Store.Charge); algorithms without debt are left
// alone, with a zero decision (not asked), as in Redis. It returns the
// bucket to keep and its state after the Charge.
func (p Policy) Charge(b State, known bool, now, cost int64) (State, Decision) {
	if !p.Algorithm.Debt() {
		return b, Decision{}
	}
	g := p.GCRA(b, known && b.IdleAt > now, now)
	wait := min(g.Wait+float64(cost)*g.interval, g.full+float64(MaxDebt))
	keep, wait := g.roundTAT(now, wait)
	d := Decision{Allowed: true, Limit: p.Limit(), Reset: at(now + nanosUp(wait)),
		Remaining: max(int64(math.Floor((g.room-wait)/g.interval)), 0)}
	if p.Algorithm == LeakyBucket { // one place at the rate, the rest in the queue
		d.Remaining = max(int64(math.Floor((g.room-wait)/g.interval))+1, 0)
	}
	return State{last: keep, IdleAt: now + nanosUp(wait)}, d
}

// MaxDebt bounds how far a Charge may put a bucket into debt: its TAT is
// at most MaxDebt beyond the time it would be full (token bucket) or its
// queue empty (leaky bucket) without the debt.
const MaxDebt = 30 * 24 * time.Hour
