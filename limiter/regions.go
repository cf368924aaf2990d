package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// The global zones (Request.Global): decided from this region's Redis
// with the region's share (regions.Exchange.Policy), and what they admit
// is told to the other regions (package regions).

// Regions are the names of every region, this one first; nil without
// regions.
func (l *Limiter) Regions() []string {
	if l.regions == nil {
		return nil
	}
	return l.regions.Names()
}

// RegionLinks are the links to the peer regions, and how many regions are
// counted as admitting up to the rate (see regions.Exchange.Links).
func (l *Limiter) RegionLinks() ([]RegionLink, int) {
	if l.regions == nil {
		return nil, 1
	}
	return l.regions.Links()
}

// RegionShare is p as this region decides a global zone of it: its share
// (p without regions).
func (l *Limiter) RegionShare(p Policy) Policy {
	if l.regions == nil {
		return p
	}
	return l.regions.Policy(p)
}

// RegionQuotaShare is a region's share of a global quota of n among
// regions: what it admits alone (see package limiter/regions).
func RegionQuotaShare(n int64, count int) int64 { return regions.ShareOf(n, int64(count)) }

// RegionBound is how far beyond the world's exact limit of p the regions
// together may admit over any period while their links are up (0 without
// regions; see regions.Exchange.Bound).
func (l *Limiter) RegionBound(p Policy) float64 {
	if l.regions == nil {
		return 0
	}
	return l.regions.Bound(p)
}

// CopyOverride copies a change of an override of a global zone to the
// peer regions (see regions.Exchange.CopyOverride): for each region,
// "written" or why it is queued; nil without regions.
func (l *Limiter) CopyOverride(zone string, digest *[16]byte, o *overrides.Override) map[string]string {
	if l.regions == nil {
		return nil
	}
	return l.regions.CopyOverride(zone, digest, o)
}

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
	c.counted = l.regions.Counted() // one count for the call: see fallBack
	for i := range scaled {
		if scaled[i].Global {
			scaled[i] = l.regionalWith(scaled[i], c.counted)
		}
	}
	l.decide(ctx, now, scaled, c, v)
	for i := range reqs {
		switch {
		case v.States[i] == Allowed && reqs[i].Policy.Algorithm == Quota && v.Decisions != nil:
			l.regions.RecordPeriod(&reqs[i], v.Decisions[i].Reset) // counted in its period only
		case v.States[i] == Allowed: // not what on_store_error allow let through uncounted
			l.regions.Record(&reqs[i])
		case v.States[i] == Refused && v.Decisions != nil && v.Calls[0].Failure == NoFailure:
			if now.IsZero() { // the clock read for refusals only, off the allow path
				now = time.Now()
			}
			l.regions.Refused(&reqs[i], scaled[i].Policy, v.Decisions[i], now)
		}
		if reqs[i].Global && v.Decisions != nil && v.States[i].Decided() {
			v.Decisions[i].Limit = reqs[i].Policy.Limit() // the zone's; Remaining is what this region admits
		}
	}
	v.Requests = reqs // Decide keeps no other reference to scaled
	clear(scaled)
	*buf = scaled[:0]
	scaledRequests.Put(buf)
}

// scaledRequests are the buffers of decideGlobal's scaled requests.
var scaledRequests = sync.Pool{New: func() any { return new([]Request) }}

// regional is req as this region decides it: a global zone's with the
// region's share of its policy.
func (l *Limiter) regional(req Request) Request {
	if req.Global && l.regions != nil {
		return l.regionalWith(req, l.regions.Counted())
	}
	return req
}

// regionalWith is regional with k regions counted: an exact token
// bucket's or quota's request also tagged with how its region decides
// (see regions.Exchange.Tag).
func (l *Limiter) regionalWith(req Request, k int64) Request {
	req.Policy = l.regions.PolicyWith(req.Policy, k)
	switch {
	case req.Sync > 0:
	case req.Policy.Algorithm == TokenBucket:
		req.ID = l.regions.Tag(k)
	case req.Policy.Algorithm == Quota:
		req.ID = l.regions.TagQuota(k)
	}
	return req
}

// SetRegionFingerprint sets what this region tells the peers it decides
// its global zones by, and compares theirs with, from the next exchange:
// a peer whose fingerprint differs is counted at its share (see package
// limiter/regions). Nothing without regions.
func (l *Limiter) SetRegionFingerprint(f RegionFingerprint) {
	if l.regions != nil {
		l.regions.SetFingerprint(f)
	}
}
