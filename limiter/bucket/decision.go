package bucket

import (
	"math"
	"time"
)

// Decision is the outcome of one check of one bucket.
type Decision struct {
	// Allowed is true when the request may pass.
	Allowed bool
	// Limit is the capacity of the bucket (the burst).
	Limit int64
	// Remaining is the number of whole tokens left after this request.
	Remaining int64
	// Reset is when the bucket is full again.
	Reset time.Time
	// RetryAfter is, for a refused request, how long until the same
	// request could pass; zero when allowed.
	RetryAfter time.Duration
	// Delay is, for a request a leaky bucket allowed, how long it waits
	// for its slot before it goes on.
	Delay time.Duration
	// Used is, for a quota, the period's count with this decision's
	// cost (an operator's account: it may exceed Limit, counted under a
	// larger quota that an override or a plan gave the key).
	Used int64
	// Cached is true for a refusal answered from a RefusedCache.
	Cached bool
	// Banned is true for the refusal of a banned client.
	Banned bool
	// At is the store's time of the decision (in Redis, the clock of the
	// node that ran it, to the µs): a Refund of the charge is made at it.
	At time.Time
}

// ResetUnix is Reset in Unix seconds, rounded up.
func (d Decision) ResetUnix() int64 {
	s := d.Reset.Unix()
	if d.Reset.Nanosecond() > 0 {
		s++
	}
	return s
}

// RetryAfterSeconds is RetryAfter in whole seconds, rounded up, at least 1.
func (d Decision) RetryAfterSeconds() int64 {
	s := int64(math.Ceil(d.RetryAfter.Seconds()))
	return max(s, 1)
}

// MoreRestrictive reports whether d should be shown to the client rather
// than o: a refusal beats an allowance, a longer wait beats a shorter one,
// fewer remaining tokens beat more.
func (d Decision) MoreRestrictive(o Decision) bool {
	if d.Allowed != o.Allowed {
		return !d.Allowed
	}
	if !d.Allowed {
		return d.RetryAfter > o.RetryAfter
	}
	return d.Remaining < o.Remaining
}
