package limiter

import (
	"fmt"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// fallBack decides reqs as fallback says, Redis having failed: allow and
// deny decide nothing (their states say it); local decides in this
// process's memory, each limit divided by the instances that share it.
func (l *Limiter) fallBack(now time.Time, reqs []Request, c Caller) ([]Decision, func()) {
	if c.Fallback.Mode != FallbackLocal {
		return nil, nil
	}
	local := make([]Request, len(reqs))
	for i, r := range reqs {
		if p, err := LocalPolicy(r.Policy, max(c.Fallback.Instances, 1)); err == nil {
			r.Policy = p
		}
		local[i] = r
	}
	d := l.memory.TakeAt(now, local)
	return d, l.holdSlots(l.memory, local, d, c.Events)
}

// LocalPolicy is a zone's share of its limit on one of n instances: the
// rate divided by n (windows keep their length, buckets refill n times
// slower), and the burst or the slots divided by n, at least 1.
func LocalPolicy(p Policy, n int) (Policy, error) {
	local := p
	switch {
	case p.Algorithm == Concurrency:
	case p.Algorithm.Windowed():
		local.Rate = max(p.Rate/int64(n), 1)
	case float64(p.Period)*float64(n) > float64(bucket.MaxPeriod):
		return p, fmt.Errorf("period %s times %d is longer than %s", p.Period, n, bucket.MaxPeriod)
	default:
		local.Period = p.Period * time.Duration(n)
	}
	local.Burst = max(p.Burst/int64(n), min(p.Burst, 1))
	if p.Algorithm.Windowed() {
		local.Burst = local.Rate
	}
	return local, local.Validate()
}
