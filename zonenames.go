package ratelimit

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/prometheus/client_golang/prometheus"
)

// Zone names are global to a store: every handler that names a zone, in
// any site or route, counts in the same buckets. That is how a limit is
// shared across sites (a snippet imported into each), and a mistake when
// two handlers give one name different limits: each would apply its own
// limit to the others' counts. So a name reused with another policy is an
// error: when the Caddyfile is adapted, at the second zone's line, naming
// the first's; when a config loads, naming both policies (in JSON there
// are no lines). The policy is what shapes a bucket: the key, the limit,
// the algorithm, burst, ban and address grouping; the matchers, the cost,
// dry_run and what counts (count_status, cost_from_response) may differ.

// sharedPolicy is what two zones of one name must agree on, as text.
func (z *Zone) sharedPolicy() string {
	p := z.policy
	s := fmt.Sprintf("key=%q %d %d/%d burst %d slots %d nodelay=%t lease=%d ban=%d/%d/%d v4=%d v6=%d empty=%q",
		z.Key, p.Algorithm, p.Rate, p.Period, p.Burst, p.Slots, p.NoDelay, p.Lease, p.Ban.After, p.Ban.Within, p.Ban.For,
		z.IPv4Prefix.bits(defaultIPv4Prefix, 32), z.IPv6Prefix.bits(defaultIPv6Prefix, 128), cmp.Or(z.OnEmptyKey, onEmptyKeyShared))
	if hasPlaceholder(z.Rate) { // the policy above is the default's
		s += fmt.Sprintf(" rate=%q", z.Rate)
	}
	if hasPlaceholder(string(z.Burst)) {
		s += fmt.Sprintf(" burst=%q", z.Burst)
	}
	if p.Algorithm == limiter.Quota {
		s += fmt.Sprintf(" quota=%q per %s", z.Quota, p.Calendar)
	}
	return s
}

// describe is the zone's policy as a config writes it, for errors: with
// the Caddyfile's shorthands when short.
func (z *Zone) describe(short bool) string {
	key := z.Key
	if short {
		key = asWritten.Replace(key)
	}
	var parts []string
	add := func(set bool, format string, v ...any) {
		if set {
			parts = append(parts, fmt.Sprintf(format, v...))
		}
	}
	add(z.Key != "", "key %s", key)
	add(z.Key == "", "no key")
	add(z.Rate != "", "rate %s", z.Rate)
	add(z.MaxEvents != 0, "events %d window %s", z.MaxEvents, time.Duration(z.Window))
	add(z.MaxConcurrent != 0, "max_concurrent %d", z.MaxConcurrent)
	add(z.Quota != "", "quota %s per %s", z.Quota, z.QuotaPer)
	add(z.TimeZone != "", "time_zone %s", z.TimeZone)
	add(z.Burst != "", "burst %s", z.Burst)
	add(z.Algorithm != "", "algorithm %s", z.Algorithm)
	add(z.NoDelay, "nodelay")
	add(z.Lease != 0, "lease %s", time.Duration(z.Lease))
	add(z.Ban != nil, "ban %d %s %s", z.policy.Ban.After, z.policy.Ban.Within, z.policy.Ban.For)
	add(z.IPv4Prefix != 0, "ipv4_prefix %d", z.IPv4Prefix.bits(defaultIPv4Prefix, 0))
	add(z.IPv6Prefix != 0, "ipv6_prefix %d", z.IPv6Prefix.bits(defaultIPv6Prefix, 0))
	add(z.OnEmptyKey != "", "on_empty_key %s", z.OnEmptyKey)
	return strings.Join(parts, ", ")
}

// asWritten writes the Caddyfile's shorthands back in a template (the
// adapter expands {client_ip} to {http.vars.client_ip}).
var asWritten = func() *strings.Replacer {
	var pairs []string
	for short, long := range shorthands {
		pairs = append(pairs, "{"+long+"}", "{"+short+"}")
	}
	return strings.NewReplacer(pairs...)
}()

// namespace names where the buckets of c live: handlers of one namespace
// share the buckets of a zone name, whatever their connection settings
// (timeouts, pools, TLS). The memory store is one namespace; a Redis one
// is its servers, database and key prefix, and its key_secret (a digest).
func (c *RedisConfig) namespace() string {
	if c == nil {
		return "memory"
	}
	addrs := slices.Clone(c.Addresses)
	slices.Sort(addrs)
	secret := ""
	if c.KeySecret != "" {
		sum := sha256.Sum256([]byte(c.KeySecret))
		secret = hex.EncodeToString(sum[:8])
	}
	return fmt.Sprintf("redis %q cluster=%t master=%q db=%d prefix=%q secret=%s", addrs, c.Cluster, c.MasterName, c.DB,
		cmp.Or(c.KeyPrefix, limiter.DefaultKeyPrefix), secret)
}

// zoneSeen is a zone name's first definition in a Caddyfile being adapted.
type zoneSeen struct {
	policy, description string
	at                  caddyfile.Token
}

// checkZoneNames refuses, in the Caddyfile being adapted, a zone that
// reuses the name of an earlier one with another policy (in the same
// namespace: see namespace), at its line.
func checkZoneNames(h httpcaddyfile.Helper, rl *Handler) error {
	seen, _ := h.State["rate_limit.zones"].(map[string]zoneSeen)
	if seen == nil {
		seen = make(map[string]zoneSeen)
		h.State["rate_limit.zones"] = seen
	}
	store := rl.Redis.namespace()
	for _, name := range sortedNames(rl.Zones) {
		z, id := rl.Zones[name], name+"\x00"+store
		first, ok := seen[id]
		if !ok {
			seen[id] = zoneSeen{z.sharedPolicy(), z.describe(true), z.at}
			continue
		}
		if first.policy != z.sharedPolicy() {
			d := caddyfile.NewDispenser([]caddyfile.Token{z.at})
			d.Next()
			return d.Errf("zone %q (%s) reuses the name of the zone at %s:%d (%s) with another policy; zones of one name "+
				"share their buckets, so define them alike (a snippet imported into each site keeps them so), or give this one a name of its own",
				name, z.describe(true), first.at.File, first.at.Line, first.description)
		}
	}
	return nil
}

// zoneClaims are the zone names of the configs loaded, by config (its
// metrics registry: one per load) and store: the policy the first handler
// gave each, and the handlers that name it.
var zoneClaims = struct {
	sync.Mutex
	m map[zoneClaimKey]*zoneClaim
}{m: make(map[zoneClaimKey]*zoneClaim)}

type zoneClaimKey struct {
	config *prometheus.Registry
	store  string
	name   string
}

type zoneClaim struct {
	policy, description string
	handlers            []*Handler
}

// claimZoneNames refuses a zone of h whose name another handler of the
// same config and store gave another policy, and else records h's.
func (h *Handler) claimZoneNames(config *prometheus.Registry) error {
	zoneClaims.Lock()
	defer zoneClaims.Unlock()
	for _, z := range h.zones {
		k := zoneClaimKey{config, h.Redis.namespace(), z.name}
		if c := zoneClaims.m[k]; c != nil && c.policy != z.sharedPolicy() {
			return fmt.Errorf("zone %q is defined twice in this config with different policies: %s, and %s; zones of one name "+
				"share their buckets, so define them alike, or give one a name of its own", z.name, c.description, z.describe(false))
		}
	}
	for _, z := range h.zones {
		k := zoneClaimKey{config, h.Redis.namespace(), z.name}
		c := zoneClaims.m[k]
		if c == nil {
			c = &zoneClaim{policy: z.sharedPolicy(), description: z.describe(false)}
			zoneClaims.m[k] = c
		}
		c.handlers = append(c.handlers, h)
	}
	h.claimConfig = config
	return nil
}

// releaseZoneNames forgets h's zone names.
func (h *Handler) releaseZoneNames() {
	zoneClaims.Lock()
	defer zoneClaims.Unlock()
	for k, c := range zoneClaims.m {
		if k.config != h.claimConfig {
			continue
		}
		for i, other := range c.handlers {
			if other == h {
				c.handlers = append(c.handlers[:i], c.handlers[i+1:]...)
				break
			}
		}
		if len(c.handlers) == 0 {
			delete(zoneClaims.m, k)
		}
	}
}
