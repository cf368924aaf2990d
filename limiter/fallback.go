package limiter

import (
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
		if p, err := bucket.InstanceShare(r.Policy, max(c.Fallback.Instances, 1)); err == nil {
			r.Policy = p
		}
		local[i] = r
	}
	d := l.memory.TakeAt(now, local)
	return d, l.holdSlots(l.memory, local, d, c.Events)
}
