package limiter

import (
	"math"
	"time"
)

// epsilon absorbs float rounding when tokens are compared or floored, so
// that 2.9999999999 tokens count as 3.
const epsilon = 1e-9

// bucket is the state of one bucket, whatever its algorithm, and when it
// may be dropped (a dropped bucket is a fresh one). Times are Unix ns but
// for the leaky bucket's TAT.
type bucket struct {
	// tokens: the tokens held (token bucket); the count of the current
	// window (fixed window, sliding counter); the requests in flight
	// (concurrency).
	tokens float64
	// prev: the count of the previous window (sliding counter); the
	// theoretical arrival time, in µs, unrounded (leaky bucket).
	prev float64
	// last: the last update (token bucket); the start of the current
	// window (fixed window, sliding counter).
	last int64
	// log: the times of the counted requests, oldest first (sliding log).
	log []int64
	// slots: the cost of each slot held, by request ID (concurrency); it
	// changes in place, and only once a take is committed (see hold).
	slots map[string]int64
	// idleAt: when the bucket is back to its initial state, so that it
	// may be dropped (concurrency: math.MaxInt64 until its last slot is
	// released).
	idleAt int64
}

// takeToken refills b up to now and charges cost tokens if it holds them.
// known is false for a bucket never seen (or dropped), which starts full.
// The returned bucket is the state to keep if the charge is committed.
func (p Policy) takeToken(b bucket, known bool, now, cost int64) (bucket, Decision) {
	tokens := float64(p.Burst)
	if known {
		tokens = p.refill(b, now)
	}
	allowed := cost <= p.Burst && tokens+epsilon >= float64(cost)
	if allowed {
		tokens = max(tokens-float64(cost), 0)
	}
	toFull := p.nanos(float64(p.Burst) - tokens)
	d := Decision{
		Allowed:   allowed,
		Limit:     p.Burst,
		Remaining: int64(math.Floor(tokens + epsilon)),
		Reset:     time.Unix(0, now+toFull),
	}
	if !allowed {
		d.RetryAfter = p.retryAfter(tokens, cost, toFull)
	}
	return bucket{tokens: tokens, last: now, idleAt: now + toFull}, d
}

// refill is the number of tokens b holds at now. A bucket from an older
// policy keeps its tokens, capped at the current burst.
func (p Policy) refill(b bucket, now int64) float64 {
	elapsed := max(now-b.last, 0)
	return min(float64(p.Burst), b.tokens+float64(elapsed)/p.Interval())
}

// retryAfter is how long until cost tokens are in the bucket. A cost above
// the burst never passes; its client is told to wait for a full bucket.
func (p Policy) retryAfter(tokens float64, cost, toFull int64) time.Duration {
	if cost > p.Burst {
		return time.Duration(max(toFull, p.nanos(1)))
	}
	return time.Duration(p.nanos(float64(cost) - tokens))
}

// nanos is the time n tokens take to refill, rounded up to a nanosecond.
func (p Policy) nanos(n float64) int64 {
	if n <= epsilon {
		return 0
	}
	return int64(math.Ceil(n * p.Interval()))
}
