package bucket

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
	// Quota counts Rate requests per period of a calendar (Policy's
	// Calendar): a day, week, month or year in a time zone, each starting
	// afresh at its start (local midnight, Monday, the 1st, 1 January).
	Quota
)

// spec is what sets an algorithm apart, in one place. Its arithmetic is
// Policy.Take's case for it (and Refund's, Charge's), its Redis script
// luascripts/<name>.lua (registered in limiter/redisstore's scripts).
type spec struct {
	name     string
	windowed bool // counts Rate per Period in windows, with no separate burst
	syncs    bool // a zone of it may sync: its admissions can be charged at once
	debt     bool // a charge may put it into debt (GCRA: its TAT moves on)
	named    bool // a zone may name it (concurrency is set by max_concurrent)
}

// specs are the algorithms' specs, by Algorithm.
var specs = [...]spec{
	TokenBucket:          {name: "token_bucket", syncs: true, debt: true, named: true},
	FixedWindow:          {name: "fixed_window", windowed: true, syncs: true, named: true},
	SlidingWindowLog:     {name: "sliding_window_log", windowed: true, named: true},
	SlidingWindowCounter: {name: "sliding_window_counter", windowed: true, syncs: true, named: true},
	LeakyBucket:          {name: "leaky_bucket", debt: true, named: true},
	Concurrency:          {name: "concurrency"},
	Quota:                {name: "quota", windowed: true, syncs: true},
}

// specOf is a's spec; the zero spec for an unknown a.
func specOf(a Algorithm) spec {
	if int(a) < len(specs) {
		return specs[a]
	}
	return spec{}
}

func (a Algorithm) String() string {
	if n := specOf(a).name; n != "" {
		return n
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// ParseAlgorithm parses an algorithm's name; "" is the token bucket.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return TokenBucket, nil
	}
	for a, sp := range specs {
		if sp.name == s && sp.named {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want token_bucket, fixed_window, sliding_window_log, sliding_window_counter or leaky_bucket)", s)
}

// Windowed reports whether the algorithm counts in windows (Rate per
// Period, no separate burst).
func (a Algorithm) Windowed() bool {
	return specOf(a).windowed
}

// Take decides one request of cost at now on bucket b (known is false for
// a fresh bucket) and returns the state to keep if the request is taken.
// A bucket idle at now is a fresh one, as a Redis key that expired (a
// token bucket full under the policy that wrote it is full under any).
// It never changes b's log or slots in place, so b stays valid for a
// rollback. cost is at most MaxCost + 1 (see BoundedCost): the algorithms
// compare it with what is left (cost <= limit - count), which cannot
// overflow whatever the count.
func (p Policy) Take(b State, known bool, now, cost int64) (State, Decision) {
	known = known && b.IdleAt > now
	if !known {
		b = State{}
	}
	switch p.Algorithm {
	case FixedWindow:
		return p.takeFixed(b, now, cost)
	case SlidingWindowLog:
		return p.takeLog(b, now, cost)
	case SlidingWindowCounter:
		return p.takeCounter(b, now, cost)
	case LeakyBucket:
		return p.takeLeaky(b, known, now, cost)
	case Concurrency:
		return p.takeSlot(b, now, cost)
	case Quota:
		return p.takeQuota(b, now, cost)
	}
	return p.takeToken(b, known, now, cost)
}

func at(ns int64) time.Time { return time.Unix(0, ns) }

// takeFixed: a counter per window; windows start at multiples of Period.
// The count is that of the window whose index b holds (as in Redis, where
// a window is known by its index: a zone whose window changes length
// starts afresh).
func (p Policy) takeFixed(b State, now, cost int64) (State, Decision) {
	period := int64(p.Period)
	now = LateReading(now, period, b.last*period)
	window := now / period
	count := int64(0)
	if b.last == window {
		count = int64(b.tokens)
	}
	end := (window + 1) * period
	d := Decision{Allowed: cost <= p.Rate-count, Limit: p.Rate, Reset: at(end)}
	if d.Allowed {
		count += cost
	} else {
		d.RetryAfter = time.Duration(end - now)
	}
	d.Remaining = max(p.Rate-count, 0)
	return State{tokens: float64(count), last: window, IdleAt: end}, d
}

// takeQuota: a counter per period of the calendar; b.last holds the
// period's start (Unix ns), so a count of another period (or another time
// zone's) is none. A late reading (of the period before the one held) is
// counted in the one held, as LateReading counts a window's.
func (p Policy) takeQuota(b State, now, cost int64) (State, Decision) {
	s, e := p.Calendar.Bounds(at(now))
	if b.last == e.UnixNano() {
		now = b.last
		s, e = p.Calendar.Bounds(at(now))
	}
	start, end := s.UnixNano(), e.UnixNano()
	count := int64(0)
	if b.last == start {
		count = int64(b.tokens)
	}
	d := Decision{Allowed: cost <= p.Rate-count, Limit: p.Rate, Reset: at(end)}
	if d.Allowed {
		count += cost
	} else {
		d.RetryAfter = time.Duration(end - now)
	}
	d.Remaining, d.Used = max(p.Rate-count, 0), count
	return State{tokens: float64(count), last: start, IdleAt: end}, d
}

// LateReading is now, or, when now falls in the window of period just
// before the one that starts at held, held. Takes are not decided in the
// order of their clock readings (a reading taken before another take's,
// of the next window, that came first): a late one is counted in the
// window already held, not as a window of its own that would drop the
// held window's count (and the next take, finding that window, drop the
// late one's). The memory store's windows and the storage fleet's counts
// read their clock through it.
func LateReading(now, period, held int64) int64 {
	if period > 0 && held == now-now%period+period {
		return held
	}
	return now
}

// Pick is reqs at idx, in idx's order.
func Pick(reqs []Request, idx []int) []Request {
	out := make([]Request, len(idx))
	for j, i := range idx {
		out[j] = reqs[i]
	}
	return out
}

// takeLog: the times of the requests counted in the last Period.
func (p Policy) takeLog(b State, now, cost int64) (State, Decision) {
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
	return State{log: log, IdleAt: idleAt}, d
}

// takeCounter: this window's count plus the previous one's, weighed by
// the part of it still inside the sliding window.
func (p Policy) takeCounter(b State, now, cost int64) (State, Decision) {
	period := int64(p.Period)
	now = LateReading(now, period, b.last*period)
	window := now / period
	start := window * period
	curr, prev := 0.0, 0.0
	switch b.last {
	case window:
		curr, prev = b.tokens, b.prev
	case window - 1:
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
	return State{tokens: curr, prev: prev, last: window, IdleAt: reset}, d
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

// takeLeaky: GCRA, as nginx's limit_req (see gcraState): the bucket keeps
// the TAT, and the wait is how long the requests queued ahead of a new one
// take to leave. A request passes if it is at most room (Burst intervals,
// plus slack), and waits that long (none with NoDelay); the queue grows by
// its cost.
func (p Policy) takeLeaky(b State, known bool, now, cost int64) (State, Decision) {
	g := p.GCRA(b, known, now)
	wait := g.Wait
	d := Decision{Allowed: wait <= g.room && cost <= p.Burst+1, Limit: p.Burst + 1}
	if d.Allowed {
		if !p.NoDelay {
			d.Delay = time.Duration(nanosUp(wait))
		}
		wait += float64(cost) * g.interval
	} else {
		d.RetryAfter = time.Duration(max(nanosUp(wait-g.full), int64(time.Microsecond)))
	}
	keep, wait := g.roundTAT(now, wait)
	// the free places: one at the rate, the rest in the queue
	d.Remaining = max(int64(math.Floor((g.room-wait)/g.interval))+1, 0)
	d.Reset = at(now + nanosUp(wait))
	return State{last: keep, IdleAt: now + nanosUp(wait)}, d
}

// takeSlot: requests in flight, released by Release. The slot is named
// by the request's ID once the take is committed (see hold).
func (p Policy) takeSlot(b State, now, cost int64) (State, Decision) {
	inFlight := int64(b.tokens)
	d := Decision{Allowed: cost <= p.Slots-inFlight, Limit: p.Slots, Reset: at(now)}
	if d.Allowed {
		inFlight += cost
	} else {
		d.RetryAfter = time.Second // no telling when one ends
	}
	d.Remaining = max(p.Slots-inFlight, 0)
	return State{tokens: float64(inFlight), slots: b.slots, IdleAt: math.MaxInt64}, d
}

// Hold names the slot of cost that a committed take gave the request id,
// so that only its own release frees it, as a lease in Redis: a slot taken
// before the bucket was reset is not this bucket's. A slot taken again
// under the same id is held once, as Redis holds one lease per id.
func (b State) Hold(id string, cost int64) State {
	if b.slots == nil {
		b.slots = make(map[string]int64)
	}
	if old, ok := b.slots[id]; ok {
		b.tokens -= float64(old)
	}
	b.slots[id] = cost
	return b
}

// Release gives back the slot of the request id, if b holds it (else it
// frees nothing); a bucket with none in flight may be dropped.
func (p Policy) Release(b State, now int64, id string) State {
	cost, ok := b.slots[id]
	if !ok {
		return b
	}
	delete(b.slots, id)
	b.tokens = max(b.tokens-float64(cost), 0)
	if len(b.slots) == 0 {
		b.tokens, b.IdleAt = 0, now
	}
	return b
}

// Syncs reports whether a zone of the algorithm may sync: the token
// bucket, and the windows kept as counters (a log of every request's time
// cannot take an instance's admissions in one charge).
func (a Algorithm) Syncs() bool {
	return specOf(a).syncs
}
