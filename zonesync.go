package ratelimit

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// checkSync checks sync against the zone's other options.
func (z *Zone) checkSync() error {
	w := z.window()
	if z.Sync == 0 && z.distributed > 0 && z.syncRefusal() == nil {
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
		return about(fmt.Errorf("sync applies to token_bucket, fixed_window and sliding_window_counter zones: "+
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
