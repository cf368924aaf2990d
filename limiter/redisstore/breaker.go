package redisstore

import (
	"sync/atomic"
	"time"
)

// Breaker is a circuit breaker in front of a remote store. After threshold
// consecutive failures it opens: Allow refuses calls for the cool-down, so
// that a dead store costs no waiting per request. Then one call at a time
// probes; a success closes the breaker, a failure opens it again.
type Breaker struct {
	threshold int64
	cooldown  time.Duration
	failures  atomic.Int64
	openUntil atomic.Int64 // Unix ns; 0 while closed
	probing   atomic.Bool
}

// NewBreaker returns a closed breaker.
func NewBreaker(threshold int, cooldown time.Duration) *Breaker {
	return &Breaker{threshold: int64(max(threshold, 1)), cooldown: cooldown}
}

// Allow reports whether a call may go to the store at now.
func (b *Breaker) Allow(now time.Time) bool {
	until := b.openUntil.Load()
	if until == 0 {
		return true
	}
	if now.UnixNano() < until {
		return false
	}
	return b.probing.CompareAndSwap(false, true)
}

// Success records a call that succeeded and reports whether it closed an
// open breaker.
func (b *Breaker) Success() (closed bool) {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
	if b.openUntil.Load() == 0 {
		return false
	}
	b.openUntil.Store(0)
	b.probing.Store(false)
	return true
}

// Failure records a call that failed at now and reports whether it opened
// a closed breaker.
func (b *Breaker) Failure(now time.Time) (opened bool) {
	n := b.failures.Add(1)
	until := now.Add(b.cooldown).UnixNano()
	if b.openUntil.Load() != 0 { // a failed probe: open again
		b.openUntil.Store(until)
		b.probing.Store(false)
		return false
	}
	// Of failures racing at the threshold, one opens the breaker.
	return n >= b.threshold && b.openUntil.CompareAndSwap(0, until)
}

// Open reports whether the breaker is open (or probing).
func (b *Breaker) Open() bool {
	return b.openUntil.Load() != 0
}

// CancelProbe gives back a probe that Allow granted but that was not sent,
// so that another call may probe.
func (b *Breaker) CancelProbe() {
	b.probing.Store(false)
}
