package limiter

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Algorithm is how a policy counts.
type Algorithm uint8

// The algorithms. Each has one Go implementation here (the memory store)
// and one Lua script (the Redis store), which agree.
const (
	// TokenBucket allows bursts up to Burst and a sustained Rate.
	TokenBucket Algorithm = iota
	// FixedWindow counts Rate requests per window of Period, windows
	// aligned on the clock: up to twice Rate across a window's edge.
	FixedWindow
	// SlidingWindowLog keeps the time of each counted request: at most
	// Rate in any Period. Exact; memory grows with Rate.
	SlidingWindowLog
	// SlidingWindowCounter weighs the previous window's count by the part
	// of it still inside the sliding window: two counters, close to exact.
	SlidingWindowCounter
	// LeakyBucket lets requests leave at Rate; up to Burst more wait for
	// their slot (or pass at once with NoDelay); the rest are refused.
	LeakyBucket
	// Concurrency limits the requests in flight to Burst.
	Concurrency
)

var algorithmNames = []string{"token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter", "leaky_bucket", "concurrency"}

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// ParseAlgorithm parses an algorithm's name; "" is the token bucket.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return TokenBucket, nil
	}
	if i := slices.Index(algorithmNames, s); i >= 0 && Algorithm(i) != Concurrency {
		return Algorithm(i), nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (want token_bucket, fixed_window, sliding_window_log, sliding_window_counter or leaky_bucket)", s)
}

// Windowed reports whether the algorithm counts in windows (Rate per
// Period, no separate burst).
func (a Algorithm) Windowed() bool {
	return a == FixedWindow || a == SlidingWindowLog || a == SlidingWindowCounter
}

// take decides one request of cost at now on bucket b (known is false for
// a fresh bucket) and returns the state to keep if the request is taken.
// It never changes b's log or slots in place, so b stays valid for a
// rollback. cost is at most MaxCost + 1 (see boundedCost): the algorithms
// compare it with what is left (cost <= limit - count), which cannot
// overflow whatever the count.
func (p Policy) take(b bucket, known bool, now, cost int64) (bucket, Decision) {
	if !known {
		b = bucket{}
	}
	switch p.Algorithm {
	case FixedWindow:
		return p.takeFixed(b, now, cost)
	case SlidingWindowLog:
		return p.takeLog(b, now, cost)
	case SlidingWindowCounter:
		return p.takeCounter(b, now, cost)
	case LeakyBucket:
		return p.takeLeaky(b, now, cost)
	case Concurrency:
		return p.takeSlot(b, now, cost)
	}
	return p.takeToken(b, known, now, cost)
}

func at(ns int64) time.Time { return time.Unix(0, ns) }

// takeFixed: a counter per window; windows start at multiples of Period.
func (p Policy) takeFixed(b bucket, now, cost int64) (bucket, Decision) {
	period := int64(p.Period)
	start := now - now%period
	count := int64(0)
	if b.last == start {
		count = int64(b.tokens)
	}
	end := start + period
	d := Decision{Allowed: cost <= p.Rate-count, Limit: p.Rate, Reset: at(end)}
	if d.Allowed {
		count += cost
	} else {
		d.RetryAfter = time.Duration(end - now)
	}
	d.Remaining = max(p.Rate-count, 0)
	return bucket{tokens: float64(count), last: start, idleAt: end}, d
}

// takeLog: the times of the requests counted in the last Period.
func (p Policy) takeLog(b bucket, now, cost int64) (bucket, Decision) {
	period := int64(p.Period)
	first, _ := slices.BinarySearch(b.log, now-period+1) // entries at or before now-period have left
	log := b.log[first:]
	count := int64(len(log))
	d := Decision{Allowed: cost <= p.Rate-count, Limit: p.Rate}
	if d.Allowed {
		log = append(slices.Clip(log), slices.Repeat([]int64{now}, int(cost))...)
	} else if cost > p.Rate || count == 0 {
		d.RetryAfter = time.Duration(period)
	} else {
		// The oldest count+cost-Rate entries must leave first.
		d.RetryAfter = time.Duration(log[count+cost-p.Rate-1] + period - now)
	}
	d.Remaining = max(p.Rate-int64(len(log)), 0)
	d.Reset = at(now)
	idleAt := now
	if len(log) > 0 {
		d.Reset, idleAt = at(log[0]+period), log[len(log)-1]+period
	}
	return bucket{log: log, idleAt: idleAt}, d
}

// takeCounter: this window's count plus the previous one's, weighed by
// the part of it still inside the sliding window.
func (p Policy) takeCounter(b bucket, now, cost int64) (bucket, Decision) {
	period := int64(p.Period)
	start := now - now%period
	curr, prev := 0.0, 0.0
	switch b.last {
	case start:
		curr, prev = b.tokens, b.prev
	case start - period:
		prev = b.tokens
	}
	weight := 1 - float64(now-start)/float64(period)
	limit, c := float64(p.Rate), float64(cost)
	d := Decision{Allowed: prev*weight+curr+c <= limit+epsilon, Limit: p.Rate}
	if d.Allowed {
		curr += c
	} else {
		d.RetryAfter = time.Duration(counterRetry(start, period, now, prev, curr, c, limit))
	}
	d.Remaining = max(int64(math.Floor(limit-prev*weight-curr+epsilon)), 0)
	reset := start + period // the previous window has faded out
	if curr > 0 {
		reset += period // and then this one
	}
	d.Reset = at(reset)
	return bucket{tokens: curr, prev: prev, last: start, idleAt: reset}, d
}

// counterRetry is how long until prev*weight + curr + c fits in limit:
// later in this window as prev fades, or in the next, as curr does.
func counterRetry(start, period, now int64, prev, curr, c, limit float64) int64 {
	if c > limit {
		return period
	}
	if room := limit - c - curr; room >= 0 && prev > 0 {
		t := start + int64(math.Ceil(float64(period)*(1-room/prev)))
		return max(t-now, 1)
	}
	next := start + period
	if curr > 0 {
		next += int64(math.Ceil(float64(period) * (1 - (limit-c)/curr)))
	}
	return max(next-now, 1)
}

// takeLeaky: GCRA, as nginx's limit_req. prev holds the theoretical
// arrival time in microseconds, unrounded (as the Lua script keeps it):
// when the queue ahead of a new request has drained.
func (p Policy) takeLeaky(b bucket, now, cost int64) (bucket, Decision) {
	interval := float64(p.Period.Microseconds()) / float64(p.Rate) // µs, as in Lua
	nowUs := float64(now / 1e3)
	tat := max(b.prev, nowUs)
	wait := tat - nowUs // for the requests queued ahead
	maxWait := float64(p.Burst) * interval
	d := Decision{Allowed: wait <= maxWait+leakySlack && cost <= p.Burst+1, Limit: p.Burst + 1}
	if d.Allowed {
		tat += float64(cost) * interval
		if !p.NoDelay {
			d.Delay = micros(wait)
		}
	} else {
		d.RetryAfter = max(micros(wait-maxWait), time.Microsecond)
	}
	ahead := (tat - nowUs) / interval // requests queued, this one included
	d.Remaining = max(int64(math.Floor(float64(p.Burst)+1-ahead+epsilon)), 0)
	d.Reset = at(now/1e3*1e3 + int64(micros(tat-nowUs)))
	return bucket{prev: tat, idleAt: now + int64(micros(tat-nowUs))}, d
}

// leakySlack absorbs the rounding of float microseconds (a quarter of a
// microsecond at today's times) when a wait is compared with the longest.
const leakySlack = 0.5

// micros rounds x microseconds up to a whole microsecond.
func micros(x float64) time.Duration {
	if x <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(x-1e-6)) * time.Microsecond
}

// takeSlot: requests in flight, released by Release. The slot is named
// by the request's ID once the take is committed (see hold).
func (p Policy) takeSlot(b bucket, now, cost int64) (bucket, Decision) {
	inFlight := int64(b.tokens)
	d := Decision{Allowed: cost <= p.Burst-inFlight, Limit: p.Burst, Reset: at(now)}
	if d.Allowed {
		inFlight += cost
	} else {
		d.RetryAfter = time.Second // no telling when one ends
	}
	d.Remaining = max(p.Burst-inFlight, 0)
	return bucket{tokens: float64(inFlight), slots: b.slots, idleAt: math.MaxInt64}, d
}

// hold names the slot of cost that a committed take gave the request id,
// so that only its own release frees it, as a lease in Redis: a slot taken
// before the bucket was reset is not this bucket's. A slot taken again
// under the same id is held once, as Redis holds one lease per id.
func (b bucket) hold(id string, cost int64) bucket {
	if b.slots == nil {
		b.slots = make(map[string]int64)
	}
	if old, ok := b.slots[id]; ok {
		b.tokens -= float64(old)
	}
	b.slots[id] = cost
	return b
}

// release gives back the slot of the request id, if b holds it (else it
// frees nothing); a bucket with none in flight may be dropped.
func (p Policy) release(b bucket, now int64, id string) bucket {
	cost, ok := b.slots[id]
	if !ok {
		return b
	}
	delete(b.slots, id)
	b.tokens = max(b.tokens-float64(cost), 0)
	if len(b.slots) == 0 {
		b.tokens, b.idleAt = 0, now
	}
	return b
}
