package ratelimit

// What the admin API's zones listing and lookups show of the run-time
// overrides: the limit in force, the config's, and the overrides that
// apply, as the requests' headers show them. Both views take them from
// overrides.Set.Effect, which the requests apply too (Zone.override in
// overrides.go): what is shown is what is enforced.

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// zoneEffect is what z's own override in set does at c's time, as for a
// request of the config's policy without a key's override: the policy in
// force, the override in force, why its limits are left out.
func zoneEffect(set *overrides.Set, z *Zone, c *overrides.Clock) overrides.Effect {
	return set.Effect(z.effectTarget(z.policy), nil, c)
}

// dryRunUnder is whether z is in dry run under e, for a handler that is
// (handlerDryRun) or not.
func dryRunUnder(e *overrides.Effect, z *Zone, handlerDryRun bool) bool {
	if e.DryRun != nil {
		return *e.DryRun
	}
	return z.DryRun || handlerDryRun
}

// zoneInfoOf is the zone of r as GET /rate_limit/zones lists it, with its
// own override in force at now.
func zoneInfoOf(r zoneRef, now time.Time) zoneInfo {
	z, h := r.z, r.h
	e := zoneEffect(h.store.overrides.Current(), z, &overrides.Clock{Now: func() time.Time { return now }})
	info := zoneInfo{Name: z.name, Key: z.Key, Algorithm: z.policy.Algorithm.String(), Rate: z.Rate,
		Limit: e.Policy.Limit(), MaxConcurrent: z.MaxConcurrent, Policy: e.Policy.String(), Store: string(h.store.Kind()),
		DryRun: dryRunUnder(&e, z, h.DryRun)}
	if e.HasZone {
		v := overrideView(overrides.Entry{Zone: z.name, Override: e.Zone})
		info.Override, info.Disabled = &v, e.Disabled
		info.ConfigLimit, info.ConfigPolicy = z.policy.Limit(), z.policy.String()
		if e.LeftOut != nil {
			info.OverrideLeftOut = e.LeftOut.Error()
		}
	}
	return info
}

// lookupKey answers a lookup of a client's bucket in ref's zone: its
// figures under the limit in force for its key, as its next response's
// headers would show them (the overrides' Effect, applied as for a
// request), and the overrides that make that limit.
func lookupKey(ref zoneRef, key string) (usage, error) {
	z, h := ref.z, ref.h
	req := z.bucket(key)
	set, clock, digest := h.store.overrides.Current(), overrides.Clock{Now: h.now}, req.Digest()
	e := set.Effect(z.effectTarget(req.Policy), &digest, &clock)
	z.apply(&e, &req, h.logger)
	u := usage{Zone: z.name, Key: req.Key, Algorithm: z.policy.Algorithm.String(), Disabled: e.Disabled, Exempt: e.Exempt}
	if e.Exempt { // the zone's limit, which the key does not count against
		req.Policy = zoneEffect(set, z, &clock).Policy
	}
	u.overrides(z, &e, digest)
	// The store waits its own timeout, on a context of its own: a caller
	// that hangs up must not count against a Redis node's breaker.
	d, err := h.store.Peek(context.Background(), req)
	if err != nil {
		return u, caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("reading the bucket: %w", err)}
	}
	u.Limit, u.Remaining, u.Reset, u.Policy = d.Limit, d.Remaining, d.ResetUnix(), req.Policy.String()
	u.setQuota(req.Policy, d, clock.Time())
	if req.Global { // the world's limit, as config_limit; remaining is what this region admits
		u.Limit = req.Policy.Limit()
	}
	if req.Block > 0 { // refused, as a ban, until the block ends
		u.Blocked, u.Remaining = true, 0
		u.Reset = limiter.Decision{Reset: clock.Time().Add(req.Block)}.ResetUnix()
	}
	left, err := h.store.BanLeft(context.Background(), req)
	if err != nil {
		return u, caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("reading the ban: %w", err)}
	}
	if left > 0 { // as the ban's refusals say (refusalbody.go)
		u.Banned, u.Remaining = true, 0
		u.BannedUntil = limiter.Decision{Reset: clock.Time().Add(left)}.ResetUnix()
	}
	if z.Sync != 0 {
		u.Sync = time.Duration(z.Sync).String()
	}
	return u, nil
}

// overrides records in u the overrides in force of e, z's and its key's
// (whose digest is digest), and the config's limit when one is in force.
func (u *usage) overrides(z *Zone, e *overrides.Effect, digest [16]byte) {
	if e.HasZone {
		v := overrideView(overrides.Entry{Zone: z.name, Override: e.Zone})
		u.ZoneOverride = &v
	}
	if e.HasKey {
		v := overrideView(overrides.Entry{Zone: z.name, Digest: hex.EncodeToString(digest[:]), Override: e.Key})
		u.KeyOverride = &v
	}
	if e.HasZone || e.HasKey {
		u.ConfigLimit = z.policy.Limit()
	}
}
