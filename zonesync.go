package ratelimit

// A zone's sync: its checks as the config loads, the bound of its
// fleet's overshoot, logged as the config loads and whenever the instances
// counted change, and the fit of an override's policy with it.

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// checkSync checks sync against the zone's other options.
func (z *Zone) checkSync() error {
	w := z.window()
	// A quota syncs only when it says so: its count is what a customer
	// is billed by, exact unless the operator trades that for calls.
	if z.Sync == 0 && z.distributed > 0 && z.syncRefusal() == nil && z.policy.Algorithm != limiter.Quota {
		d := z.distributed
		if w > 0 && !z.viaStorage {
			d = min(d, w/2)
		}
		if d >= minSync { // else exact
			z.Sync = caddy.Duration(d)
		}
	}
	d := time.Duration(z.Sync)
	switch {
	case d == 0:
		return nil
	case d < minSync || d > maxSync:
		return about(fmt.Errorf("sync %s: want an interval from %s to %s", d, minSync, maxSync), "sync")
	case w > 0 && d > w/2 && !z.viaStorage:
		return about(fmt.Errorf("sync %s on a window of %s: at most half the window (%s), since each instance reads "+
			"what the window has left once per sync", d, w, w/2), "sync", "rate", "window")
	}
	return z.syncRefusal()
}

// window is the length of the zone's window, 0 for an algorithm without.
func (z *Zone) window() time.Duration { return windowOf(z.policy) }

// windowOf is the length of p's window, 0 for an algorithm without.
func windowOf(p limiter.Policy) time.Duration {
	if a := p.Algorithm; a == limiter.FixedWindow || a == limiter.SlidingWindowCounter || a == limiter.SlidingWindowLog {
		return p.Period
	}
	return 0
}

// syncFits reports whether p, the zone's policy under an override, keeps
// within what the zone's sync allows: a window at least twice the sync
// (see checkSync).
func (z *Zone) syncFits(p limiter.Policy) error {
	d, w := time.Duration(z.Sync), windowOf(p)
	if d > 0 && w > 0 && d > w/2 && !z.viaStorage {
		return fmt.Errorf("the zone syncs every %s: a window of %s is too short (at most half the window between syncs); give a window of at least %s", d, w, 2*d)
	}
	return nil
}

// syncRefusal is why the zone cannot sync, nil when it can.
func (z *Zone) syncRefusal() error {
	switch {
	case z.policy.Algorithm == limiter.SlidingWindowLog:
		return about(fmt.Errorf("sync counts with counters, and sliding_window_log keeps one entry per request: "+
			"use algorithm sliding_window_counter (close to it), or leave sync out"), "sync", "algorithm", "events")
	case !z.policy.Algorithm.Syncs():
		return about(fmt.Errorf("sync applies to token_bucket, fixed_window, sliding_window_counter and quota zones: "+
			"%s counts exactly in Redis (leave sync out, or use one of them)", z.policy.Algorithm), "sync", "algorithm", "events")
	case z.Ban != nil:
		return about(fmt.Errorf("sync and ban: a ban is looked up in Redis on every request; leave one out"), "sync", "ban")
	case z.settles():
		return about(fmt.Errorf("sync does not apply with count_status or cost_from_response, which settle in Redis after each response"), "sync", "count_status", "cost_from_response")
	}
	return nil
}

// Bounds of Zone.Sync.
const (
	minSync = 10 * time.Millisecond
	maxSync = time.Hour
)

// logSyncBounds logs, for each zone of h that syncs, how far beyond its
// exact limit the fleet may admit, from the instances syncing now (at
// least on_store_error local's instances), and has the store log it
// again whenever the instances counted change (InstancesChanged).
func (h *Handler) logSyncBounds() {
	for _, z := range h.zones {
		if z.Sync == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n := h.store.CountSync(ctx, time.Duration(z.Sync))
		cancel()
		h.store.holdSyncing(h, true)
		h.logBounds(n)
		return
	}
}

// logBounds logs the bound of each zone of h that syncs with n instances
// counted.
func (h *Handler) logBounds(n int) {
	n = max(n, h.caller.Fallback.Instances, 1)
	for _, z := range h.zones {
		if z.Sync == 0 {
			continue
		}
		b := syncBound(z.policy, time.Duration(z.Sync), n)
		h.logger.Info("zone syncs "+h.syncedThrough()+": its decisions are local, and over any period the fleet may admit beyond the exact limit up to rate × sync + (instances − 1) / instances × (burst + rate × sync)",
			zap.String("zone", z.name), zap.String("algorithm", z.policy.Algorithm.String()), zap.Duration("sync", time.Duration(z.Sync)), zap.Int("instances", n),
			zap.Int64("bound", b), zap.Int64("with_one_more_instance", syncBound(z.policy, time.Duration(z.Sync), n+1)))
	}
}

// holdSyncing records whether h, which has zones that sync, holds the
// store (false: h lets go of it).
func (s *sharedLimiter) holdSyncing(h *Handler, holds bool) {
	s.capacityMu.Lock()
	defer s.capacityMu.Unlock()
	if !holds {
		delete(s.syncing, h)
		return
	}
	if s.syncing == nil {
		s.syncing = map[*Handler]bool{}
	}
	s.syncing[h] = true
}

// syncedThrough says where the zones that sync share their counts.
func (h *Handler) syncedThrough() string {
	if h.storage != nil {
		return "through the storage"
	}
	return "with Redis"
}

// syncBound is the most a fleet of n instances syncing every interval may
// admit beyond policy's exact limit over a period (see
// limiter/fleetsync/doc.go), rounded up.
func syncBound(p limiter.Policy, interval time.Duration, n int) int64 {
	n = max(n, 1)
	refill := float64(p.Rate) * interval.Seconds() / p.Period.Seconds()
	over := refill + (float64(p.Burst)+refill)*float64(n-1)/float64(n)
	return int64(math.Ceil(over))
}

// syncFits reports whether p fits the sync of every zone of t's name.
func (t overrideTarget) syncFits(p limiter.Policy) error {
	for _, ref := range t.refs {
		if err := ref.z.syncFits(p); err != nil {
			return err
		}
	}
	return nil
}

// syncBound is, for a zone that syncs, the bound of the fleet's
// overshoot (see syncBound) under o, for the instances counted now; false
// for a zone that does not sync, or an override that sets no limit.
func (t overrideTarget) syncBound(o *overrides.Override) (int64, bool) {
	if len(t.refs) == 0 || t.refs[0].z.Sync == 0 || o.Fits(t.refs[0].z.policy.Algorithm) != nil || o.Kind() != "limit" {
		return 0, false
	}
	z, h := t.refs[0].z, t.refs[0].h
	n := max(t.store.Instances(), h.caller.Fallback.Instances, 1)
	return syncBound(o.Apply(z.policy, z.Burst != ""), time.Duration(z.Sync), n), true
}
