package ratelimit

// What the admin API's zones listing and lookups show of the run-time
// overrides: the limit in force, the config's, and the overrides that
// apply, as the requests' headers show them (overrides.go applies them to
// requests).

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// zoneInForce is what a zone's own override does at a time: the policy in
// force (the config's, unless the override's limits apply), the override
// in force (nil when none is), and why its limits are left out when they
// do not fit the zone.
type zoneInForce struct {
	policy   limiter.Policy
	override *overrides.Override
	leftOut  error
}

// inForce is z's policy under its own override in set at now, decided as
// for a request (Zone.override) but logging nothing.
func (z *Zone) inForce(set *overrides.Set, now time.Time) zoneInForce {
	f := zoneInForce{policy: z.policy}
	o, ok := set.Zone(z.name)
	if !ok || !o.Active(now) {
		return f
	}
	f.override = &o
	if o.Rate == "" && o.Burst == 0 && o.MaxConcurrent == 0 {
		return f // disabled, or dry_run alone
	}
	if err := overrideFits(z.policy.Algorithm, &o); err != nil {
		f.leftOut = err
		return f
	}
	p := z.withOverride(z.policy, &o)
	if err := cmp.Or(p.Validate(), checkAlgorithmLimits(p), z.syncFits(p)); err != nil {
		f.leftOut = err
		return f
	}
	f.policy = p
	return f
}

// dryRun is whether z is in dry run under f's override, for a handler
// that is (handlerDryRun) or not.
func (f zoneInForce) dryRun(z *Zone, handlerDryRun bool) bool {
	if f.override != nil && f.override.DryRun != nil {
		return *f.override.DryRun
	}
	return z.DryRun || handlerDryRun
}

// zoneInfoOf is the zone of r as GET /rate_limit/zones lists it, with its
// own override in force at now.
func zoneInfoOf(r zoneRef, now time.Time) zoneInfo {
	z, h := r.z, r.h
	f := z.inForce(h.store.overrides.Current(), now)
	info := zoneInfo{Name: z.name, Key: z.Key, Algorithm: z.policy.Algorithm.String(), Rate: z.Rate,
		Limit: f.policy.Limit(), MaxConcurrent: z.MaxConcurrent, Policy: f.policy.String(), Store: string(h.store.Kind()),
		DryRun: f.dryRun(z, h.DryRun)}
	if f.override != nil {
		v := overrideView(overrides.Entry{Zone: z.name, Override: *f.override})
		info.Override, info.Disabled = &v, f.override.Disabled
		info.ConfigLimit, info.ConfigPolicy = z.policy.Limit(), z.policy.String()
		if f.leftOut != nil {
			info.OverrideLeftOut = f.leftOut.Error()
		}
	}
	return info
}

// lookupKey answers a lookup of a client's bucket in ref's zone: its
// figures under the limit in force for its key, as its next response's
// headers would show them, and the overrides that make that limit.
func lookupKey(ref zoneRef, key string) (usage, error) {
	z, h := ref.z, ref.h
	req := z.bucket(key)
	set, clock := h.store.overrides.Current(), overrideClock{now: h.now}
	f := z.inForce(set, clock.time())
	u := usage{Zone: z.name, Key: req.Key, Algorithm: z.policy.Algorithm.String(),
		Disabled: zoneDisabled(set, z, &clock)}
	u.Exempt = !z.override(set, &req, &clock, h.logger)
	if u.Exempt {
		req.Policy = f.policy // the zone's limit, which the key does not count against
	}
	u.overrides(set, z, &req, f, clock.time())
	// The store waits its own timeout, on a context of its own: a caller
	// that hangs up must not count against a Redis node's breaker.
	d, err := h.store.Peek(context.Background(), req)
	if err != nil {
		return u, caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("reading the bucket: %w", err)}
	}
	u.Limit, u.Remaining, u.Reset, u.Policy = d.Limit, d.Remaining, d.ResetUnix(), req.Policy.String()
	if req.Block > 0 { // refused, as a ban, until the block ends
		u.Blocked, u.Remaining = true, 0
		u.Reset = limiter.Decision{Reset: clock.time().Add(req.Block)}.ResetUnix()
	}
	left, err := h.store.BanLeft(context.Background(), req)
	if err != nil {
		return u, caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("reading the ban: %w", err)}
	}
	if left > 0 { // as the ban's refusals say (refusalbody.go)
		u.Banned, u.Remaining = true, 0
		u.BannedUntil = limiter.Decision{Reset: clock.time().Add(left)}.ResetUnix()
	}
	if z.Sync != 0 {
		u.Sync = time.Duration(z.Sync).String()
	}
	return u, nil
}

// overrides records in u the overrides in force at now of z (f) and of
// req's key, and the config's limit when one is in force.
func (u *usage) overrides(set *overrides.Set, z *Zone, req *limiter.Request, f zoneInForce, now time.Time) {
	if f.override != nil {
		v := overrideView(overrides.Entry{Zone: z.name, Override: *f.override})
		u.ZoneOverride = &v
	}
	digest := req.Digest()
	if o, ok := set.Key(z.name, digest); ok && o.Active(now) {
		v := overrideView(overrides.Entry{Zone: z.name, Digest: hex.EncodeToString(digest[:]), Override: o})
		u.KeyOverride = &v
	}
	if u.ZoneOverride != nil || u.KeyOverride != nil {
		u.ConfigLimit = z.policy.Limit()
	}
}
