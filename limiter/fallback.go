package limiter

import (
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// fallBack decides reqs as fallback says, Redis having failed: allow and
// deny decide nothing (their states say it); local decides in this
// process's memory, each limit divided by the instances that share it. A
// global zone's (its policy the region's share of the burst, and of the
// rate of the regions counted) is decided with the region's share of the
// rate too (a quota's, with the region's share of the quota): the peers
// are charged what it admits, but it does not see theirs.
func (l *Limiter) fallBack(now time.Time, reqs []Request, c Caller) ([]Decision, func()) {
	if c.Fallback.Mode != FallbackLocal {
		return nil, nil
	}
	local := make([]Request, len(reqs))
	for i, r := range reqs {
		if r.Global && c.counted > 1 && r.Policy.Algorithm == bucket.TokenBucket {
			r.Policy.Period *= time.Duration(c.counted) // from rate × k / R to rate / R
		}
		if r.Global && r.Policy.Algorithm == bucket.Quota && l.regions != nil {
			r.Policy.Rate = regions.ShareOf(r.Policy.Rate, int64(l.regions.Regions()))
		}
		if p, err := bucket.InstanceShare(r.Policy, max(c.Fallback.Instances, 1)); err == nil {
			r.Policy = p
		}
		local[i] = r
	}
	d := l.memory.TakeAt(now, local)
	return d, l.holdSlots(l.memory, local, d, c.Events)
}
