package ratelimit

// The zone block of the rate_limit directive (see Handler.UnmarshalCaddyfile).

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// unmarshalZone parses a zone block into h.Zones.
func unmarshalZone(d *caddyfile.Dispenser, h *Handler) error {
	d = d.NewFromNextSegment()
	d.Next() // "zone"
	if d.NextArg() {
		if _, dup := h.Zones[d.Val()]; dup {
			return d.Errf("duplicate zone %q", d.Val())
		}
	}
	d.Reset()
	z := new(Zone)
	if err := z.UnmarshalCaddyfile(d); err != nil {
		return err
	}
	if h.Zones == nil {
		h.Zones = make(map[string]*Zone)
	}
	h.Zones[z.name] = z
	return nil
}

// UnmarshalCaddyfile parses a zone block: zone <name> { ... } (see
// Handler.UnmarshalCaddyfile), and checks the zone, so that its errors
// point at its first line.
func (z *Zone) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "zone"
	zoneLine := d.Token()
	z.at = zoneLine
	if !d.NextArg() || d.Val() == "{" {
		return d.Err("zone needs a name: zone <name> { ... }")
	}
	z.name = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if err := parseSubdirectives(d, fmt.Sprintf("zone %q: ", z.name), z, zoneOptions); err != nil {
		return err
	}
	if err := z.check(); err != nil {
		d = caddyfile.NewDispenser([]caddyfile.Token{z.blame(err, zoneLine)})
		d.Next()
		return d.Errf("zone %q: %v", z.name, err)
	}
	return nil
}

// checkConstantKeys refuses, in a handler without Redis, a zone key that
// is the same for every request (see checkConstantKey), at its line. With
// Redis, a key such as {system.hostname} is one bucket per instance.
func checkConstantKeys(h *Handler) error {
	if h.Redis != nil || h.Distributed != nil {
		return nil
	}
	for _, name := range sortedNames(h.Zones) {
		z := h.Zones[name]
		if err := checkConstantKey(z.Key); err != nil {
			at := z.at
			for _, tok := range z.subdirectives {
				if tok.Text == "key" {
					at = tok
				}
			}
			d := caddyfile.NewDispenser([]caddyfile.Token{at})
			d.Next()
			return d.Errf("zone %q: %v", name, err)
		}
	}
	return nil
}

// saw records a subdirective of the zone's block, for blame.
func (z *Zone) saw(tok caddyfile.Token) { z.subdirectives = append(z.subdirectives, tok) }

// blame is where an error of check points: at the last of the
// subdirectives it is about (the second of two that conflict); else, or
// when none of them is written, at the zone's line, first.
func (z *Zone) blame(err error, first caddyfile.Token) caddyfile.Token {
	var ab *aboutError
	if !errors.As(err, &ab) {
		return first
	}
	at := first
	for _, tok := range z.subdirectives {
		if slices.Contains(ab.options, tok.Text) {
			at = tok
		}
	}
	return at
}

// zoneOptions parse the subdirectives of a zone block, one each.
var zoneOptions = map[string]func(*caddyfile.Dispenser, *Zone) error{
	"match":        parseZoneMatch,
	"key":          parseZoneKey,
	"rate":         parseZoneRate,
	"quota":        parseQuota,    // zonequota.go
	"time_zone":    parseTimeZone, // zonequota.go
	"burst":        func(d *caddyfile.Dispenser, z *Zone) error { return parseCount(d, z, &z.Burst, &z.DefaultBurst) },
	"cost":         func(d *caddyfile.Dispenser, z *Zone) error { return parseCount(d, z, &z.Cost, &z.DefaultCost) },
	"ipv4_prefix":  func(d *caddyfile.Dispenser, z *Zone) error { return parsePrefix(d, z, &z.IPv4Prefix, 32) },
	"ipv6_prefix":  func(d *caddyfile.Dispenser, z *Zone) error { return parsePrefix(d, z, &z.IPv6Prefix, 128) },
	"events":       parseEvents,
	"window":       parseWindow,
	"on_empty_key": parseOnEmptyKey,
	"algorithm":    parseAlgorithm,
	"nodelay":      func(d *caddyfile.Dispenser, z *Zone) error { return noArgs(d, &z.NoDelay) },
	"max_concurrent": func(d *caddyfile.Dispenser, z *Zone) error {
		n := 0
		err := intArg(d, &n, 1)
		z.MaxConcurrent = int64(n)
		return err
	},
	"lease": parseLease,
	"sync": func(d *caddyfile.Dispenser, z *Zone) error {
		var err error
		z.Sync, err = durationArg(d, minSync, fmt.Sprintf("zone %q: sync %%q: want an interval from 10ms to 1h, such as 100ms", z.name))
		return err
	},
	"dry_run":            func(d *caddyfile.Dispenser, z *Zone) error { return noArgs(d, &z.DryRun) },
	"global":             parseGlobal, // regions.go
	"ban":                parseBan,
	"count_status":       parseCountStatus,
	"cost_from_response": parseCostFromResponse,
}

// parseCountStatus parses: count_status <status|class>..., e.g.
// count_status 401 403, or 4xx.
func parseCountStatus(d *caddyfile.Dispenser, z *Zone) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.Errf("zone %q: want count_status <status>..., e.g. count_status 401 403, or 4xx", z.name)
	}
	for _, a := range args {
		s := a
		if len(s) == 3 && strings.HasSuffix(s, "xx") {
			s = s[:1] // a class: 4 for 4xx, as Caddy's status matchers
		}
		n, err := strconv.Atoi(s)
		if err != nil || len(s) != 1 && len(s) != 3 {
			return d.Errf("zone %q: count_status %q: want a status such as 401, or a class such as 4xx", z.name, a)
		}
		z.CountStatus = append(z.CountStatus, n)
	}
	return nil
}

// parseCostFromResponse parses: cost_from_response <header> [strip].
func parseCostFromResponse(d *caddyfile.Dispenser, z *Zone) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 || len(args) == 2 && args[1] != "strip" {
		return d.Errf("zone %q: want cost_from_response <header> [strip]", z.name)
	}
	z.CostFromResponse, z.StripCostHeader = args[0], len(args) == 2
	return nil
}

// parseBan parses: ban <refusals> <within> <for>.
func parseBan(d *caddyfile.Dispenser, z *Zone) error {
	args := d.RemainingArgs()
	if len(args) != 3 {
		return d.Errf("zone %q: want ban <refusals> <within> <for>, e.g. ban 10 1m 15m", z.name)
	}
	n, err := strconv.ParseInt(args[0], 10, 64)
	within, err2 := caddy.ParseDuration(args[1])
	banFor, err3 := caddy.ParseDuration(args[2])
	if err != nil || n < 1 || err2 != nil || within <= 0 || err3 != nil || banFor <= 0 {
		return d.Errf("zone %q: ban %s: want a number of refusals and two positive durations, e.g. ban 10 1m 15m", z.name, strings.Join(args, " "))
	}
	z.Ban = &BanConfig{After: n, Within: caddy.Duration(within), For: caddy.Duration(banFor)}
	return nil
}

func parseJitter(d *caddyfile.Dispenser, h *Handler) error {
	var err error
	h.RetryAfterJitter, err = durationArg(d, 0, "retry_after_jitter %q: want a duration such as 5s")
	return err
}

func parseAlgorithm(d *caddyfile.Dispenser, z *Zone) error {
	if err := oneArg(d, &z.Algorithm); err != nil {
		return err
	}
	if _, err := bucket.ParseAlgorithm(z.Algorithm); err != nil {
		return d.Errf("zone %q: %v", z.name, err)
	}
	return nil
}

func parseLease(d *caddyfile.Dispenser, z *Zone) error {
	var err error
	z.Lease, err = durationArg(d, time.Second, fmt.Sprintf("zone %q: lease %%q: want a duration of at least 1s", z.name))
	return err
}

func parseZoneMatch(d *caddyfile.Dispenser, z *Zone) error {
	set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
	if err != nil {
		return err
	}
	z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
	return nil
}

// parseZoneKey parses: key <template>, whose placeholders Caddy must know.
func parseZoneKey(d *caddyfile.Dispenser, z *Zone) error {
	if err := oneArg(d, &z.Key); err != nil {
		return err
	}
	if err := checkPlaceholders("key", z.Key); err != nil {
		return d.Errf("zone %q: %v", z.name, err)
	}
	return nil
}

// parseZoneRate parses: rate <N>r/<unit> | rate <template> <default>.
func parseZoneRate(d *caddyfile.Dispenser, z *Zone) error {
	tmpl, dflt, err := templateArgs(d)
	if err != nil {
		return err
	}
	z.Rate, z.DefaultRate = tmpl, dflt
	if err := checkPlaceholders("rate", tmpl); err != nil {
		return d.Errf("zone %q: %v", z.name, err)
	}
	check := cmp.Or(dflt, tmpl)
	switch {
	case hasPlaceholder(dflt):
		return d.Errf("zone %q: default rate %q: want a rate, not a placeholder", z.name, dflt)
	case hasPlaceholder(check):
		return d.Errf("zone %q: rate %q has placeholders: give a default rate after it", z.name, tmpl)
	}
	if _, _, err := parseRate(check); err != nil {
		return d.Errf("zone %q: %v", z.name, err)
	}
	return nil
}

// parseCount parses burst or cost: <n> | <template> [<default n>].
func parseCount(d *caddyfile.Dispenser, z *Zone, v *caddyhttp.WeakString, dflt *int64) error {
	field := d.Val()
	tmpl, def, err := templateArgs(d)
	if err != nil {
		return err
	}
	*v = caddyhttp.WeakString(tmpl)
	if err := checkPlaceholders(field, tmpl); err != nil {
		return d.Errf("zone %q: %v", z.name, err)
	}
	if hasPlaceholder(def) {
		return d.Errf("zone %q: default %s %q: want a number, not a placeholder", z.name, field, def)
	}
	check := cmp.Or(def, tmpl)
	if hasPlaceholder(check) {
		return nil
	}
	n, err := strconv.ParseInt(check, 10, 64)
	if err != nil || n < 1 {
		return d.Errf("zone %q: %s %q: want a whole number of at least 1", z.name, field, check)
	}
	if def != "" {
		*dflt = n
	}
	return nil
}

// parsePrefix parses ipv4_prefix or ipv6_prefix: <bits>, 0 for no
// grouping.
func parsePrefix(d *caddyfile.Dispenser, z *Zone, dst *PrefixLength, maxBits int) error {
	field := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > maxBits {
		return d.Errf("zone %q: %s %q: want 0 (no grouping) to %d", z.name, field, s, maxBits)
	}
	*dst = PrefixLength(n)
	if n == 0 {
		*dst = noGrouping
	}
	return nil
}

// parseEvents parses caddy-ratelimit's events <N>: the limit of a window.
func parseEvents(d *caddyfile.Dispenser, z *Zone) error {
	n := 0
	err := intArg(d, &n, 1)
	z.MaxEvents = int64(n)
	return err
}

// parseWindow parses caddy-ratelimit's window <duration>.
func parseWindow(d *caddyfile.Dispenser, z *Zone) error {
	var err error
	z.Window, err = durationArg(d, time.Millisecond, fmt.Sprintf("zone %q: window %%q: want a duration of at least 1ms, such as 1m", z.name))
	return err
}

func parseOnEmptyKey(d *caddyfile.Dispenser, z *Zone) error {
	if err := oneArg(d, &z.OnEmptyKey); err != nil {
		return err
	}
	if !onEmptyKeyChoices.has(z.OnEmptyKey) {
		return d.Errf("zone %q: %v", z.name, onEmptyKeyChoices.refuse("on_empty_key", z.OnEmptyKey))
	}
	return nil
}
