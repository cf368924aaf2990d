package bucket

import (
	"math"
	"time"
)

// epsilon absorbs float rounding when counts are compared or floored, so
// that 2.9999999999 counts as 3.
const epsilon = 1e-9

// State is the state of one bucket, whatever its algorithm, and when it
// may be dropped (a dropped bucket is a fresh one). Times are Unix ns.
type State struct {
	// tokens: the count of the current window (fixed window, sliding
	// counter); the requests in flight (concurrency).
	tokens float64
	// prev: the count of the previous window (sliding counter).
	prev float64
	// last: the time a GCRA keeps (token bucket: when it was empty;
	// leaky bucket: its TAT; see gcraState); the index of the current
	// window, since the Unix epoch, in windows of the policy's period
	// (fixed window, sliding counter).
	last int64
	// log: the times of the counted requests, oldest first (sliding log).
	log []int64
	// slots: the cost of each slot held, by request ID (concurrency); it
	// changes in place, and only once a take is committed (see hold).
	slots map[string]int64
	// IdleAt: when the bucket is back to its initial state, so that it
	// may be dropped (concurrency: math.MaxInt64 until its last slot is
	// released).
	IdleAt int64
}

// The token and leaky buckets are GCRA, as the Redis scripts
// (luascripts/gcra.lua): a bucket is one time, in b.last (Unix ns). GCRA's
// theoretical arrival time (TAT) is when the requests charged so far are
// paid for at the rate: the token bucket is full again, the leaky bucket's
// queue has drained. Each unit of cost moves it on by one interval (the
// policy's Interval), from now when it is past. The leaky bucket keeps the
// TAT; the token bucket keeps the TAT less its burst's refill time: when
// it was empty, refilling since (see takeToken). The time is kept rounded
// up to the nanosecond, which delays it by less than 1 ns per charge; a
// request may come up to slack early, which absorbs that.

// gcraState is what a GCRA decision works with.
type gcraState struct {
	interval float64 // ns
	full     float64 // Burst intervals: the wait of an empty bucket, a full queue
	room     float64 // the most a charge may leave the TAT ahead of now: full, plus slack
	offset   float64 // how far before the TAT the kept time is: full for the token bucket, else 0
	Wait     float64 // how far the TAT is ahead of now: 0 when past, or for a fresh bucket
}

// GCRA is the state of b at now for p's GCRA (see gcraState).
func (p Policy) GCRA(b State, known bool, now int64) gcraState {
	g := gcraState{interval: p.Interval()}
	g.full = float64(p.Burst) * g.interval
	g.room = g.full + slack(g.interval)
	if p.Algorithm == TokenBucket {
		g.offset = g.full
	}
	if known {
		g.Wait = max(float64(b.last-now)+g.offset, 0)
	}
	return g
}

// roundTAT is the time to keep for a TAT wait ns ahead of now, rounded up
// to the nanosecond (but for a hundredth of one: the error of the Lua
// script's doubles, which count µs, over a day), and the wait it stands
// for (0 when wait is: nothing is charged any more).
func (g gcraState) roundTAT(now int64, wait float64) (keep int64, rounded float64) {
	keep = now + int64(math.Ceil(wait-g.offset-1e-2))
	if wait <= 0 {
		return keep, 0
	}
	return keep, max(float64(keep-now)+g.offset, 0)
}

// slack is how early a request may come and still pass: a microsecond,
// the resolution of the Redis clock, which absorbs the rounding of the
// TAT; at most half an interval, so that no extra request passes.
func slack(interval float64) float64 {
	return min(float64(time.Microsecond), interval/2)
}

// nanosUp rounds x ns up to a whole nanosecond (but for a millionth of
// one, float rounding).
func nanosUp(x float64) int64 {
	if x <= 0 {
		return 0
	}
	return int64(math.Ceil(x - 1e-6))
}

// takeToken charges cost tokens if the bucket holds them: if they leave
// its TAT at most room ahead of now. The bucket keeps the time it was
// empty (its TAT less full); it holds min(Burst, (now - that) / interval)
// tokens. That time does not depend on the policy: when a zone's policy
// changes, its tokens carry over, capped at the new burst, and if the
// rate changes too, so does the time they took to refill. known is false
// for a bucket never seen (or dropped), which is full. The returned bucket
// is the state to keep if the charge is committed.
func (p Policy) takeToken(b State, known bool, now, cost int64) (State, Decision) {
	g := p.GCRA(b, known, now)
	wait := g.Wait // beyond full in debt (see charge): refused until it is repaid
	allowed := cost <= p.Burst && wait+float64(cost)*g.interval <= g.room
	if allowed {
		wait += float64(cost) * g.interval
	}
	keep, wait := g.roundTAT(now, wait)
	toFull := nanosUp(wait)
	d := Decision{
		Allowed:   allowed,
		Limit:     p.Burst,
		Remaining: max(int64(math.Floor((g.room-wait)/g.interval)), 0),
		Reset:     time.Unix(0, now+toFull),
	}
	switch {
	case allowed:
	case cost > p.Burst: // never passes; its client is told to wait for a full bucket
		d.RetryAfter = time.Duration(max(toFull, nanosUp(g.interval)))
	default: // until cost tokens are in the bucket
		d.RetryAfter = time.Duration(nanosUp(wait + float64(cost)*g.interval - g.full))
	}
	return State{last: keep, IdleAt: now + toFull}, d
}
