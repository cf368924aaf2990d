package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// The global zones (Request.Global): decided from this region's Redis
// with the region's share (regions.Exchange.Policy), and what they admit
// is told to the other regions (package regions).

// SetRegions makes the Limiter decide its global zones with x, which it
// starts, and closes with the Limiter. Call it before the first Decide.
func (l *Limiter) SetRegions(x *regions.Exchange) {
	l.regions = x
	x.Start()
}

// Regions is the exchange of the global zones; nil without regions.
func (l *Limiter) Regions() *regions.Exchange { return l.regions }

// anyGlobal reports whether a request of reqs is of a global zone.
func anyGlobal(reqs []Request) bool {
	for i := range reqs {
		if reqs[i].Global {
			return true
		}
	}
	return false
}

// decideGlobal is Decide for requests of which some are global: they are
// decided with this region's share of their policies, and what they
// admitted is recorded for the other regions. v.Requests are reqs, as
// the caller gave them.
func (l *Limiter) decideGlobal(ctx context.Context, now time.Time, reqs []Request, c Caller, v *Verdict) {
	buf := scaledRequests.Get().(*[]Request)
	scaled := append((*buf)[:0], reqs...)
	for i := range scaled {
		if scaled[i].Global {
			scaled[i].Policy = l.regions.Policy(scaled[i].Policy)
		}
	}
	l.decide(ctx, now, scaled, c, v)
	v.Requests = reqs // Decide keeps no other reference to scaled
	clear(scaled)
	*buf = scaled[:0]
	scaledRequests.Put(buf)
	for i := range reqs {
		if v.States[i] == Allowed { // not what on_store_error allow let through uncounted
			l.regions.Record(&reqs[i])
		}
	}
}

// scaledRequests are the buffers of decideGlobal's scaled requests.
var scaledRequests = sync.Pool{New: func() any { return new([]Request) }}

// regional is req as this region decides it: a global zone's with the
// region's share of its policy.
func (l *Limiter) regional(req Request) Request {
	if req.Global && l.regions != nil {
		req.Policy = l.regions.Policy(req.Policy)
	}
	return req
}

// Redis is the Redis store that decides; nil with memory alone.
func (l *Limiter) Redis() *redisstore.Store { return l.redis }
