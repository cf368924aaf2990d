package ratelimit

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	// Before basic_auth (and its old name basicauth): password guessing is
	// limited too, and every handler that answers requests comes later.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basicauth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	rl := new(Handler)
	err := rl.UnmarshalCaddyfile(h.Dispenser)
	return rl, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	rate_limit [<matcher>] {
//		zone <name> {
//			match {
//				<matchers>
//			}
//			key   <template>
//			rate  <N>r/<s|m|h|d>
//			burst <N>
//		}
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "zone":
			if err := h.unmarshalZone(d.NewFromNextSegment()); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized subdirective %q", d.Val())
		}
	}
	if len(h.Zones) == 0 {
		return d.Err("rate_limit needs at least one zone")
	}
	return nil
}

// unmarshalZone parses one zone block, given as its own dispenser so that
// errors about the whole zone point at its first line.
func (h *Handler) unmarshalZone(d *caddyfile.Dispenser) error {
	d.Next() // "zone"
	if !d.NextArg() || d.Val() == "{" {
		return d.Err("zone needs a name: zone <name> { ... }")
	}
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if _, dup := h.Zones[name]; dup {
		return d.Errf("duplicate zone %q", name)
	}
	z := &Zone{name: name}
	for d.NextBlock(0) {
		parse, ok := zoneOptions[d.Val()]
		if !ok {
			return d.Errf("zone %q: unrecognized subdirective %q", name, d.Val())
		}
		if err := parse(d, z); err != nil {
			return err
		}
	}
	if _, err := z.parsePolicy(); err != nil {
		d.Reset()
		d.Next()
		return d.Errf("zone %q: %v", name, err)
	}
	if h.Zones == nil {
		h.Zones = make(map[string]*Zone)
	}
	h.Zones[name] = z
	return nil
}

// zoneOptions parse the subdirectives of a zone block, one each.
var zoneOptions = map[string]func(*caddyfile.Dispenser, *Zone) error{
	"match": parseZoneMatch,
	"key":   parseZoneKey,
	"rate":  parseZoneRate,
	"burst": parseZoneBurst,
}

func parseZoneMatch(d *caddyfile.Dispenser, z *Zone) error {
	set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
	if err != nil {
		return err
	}
	z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
	return nil
}

func parseZoneKey(d *caddyfile.Dispenser, z *Zone) error {
	return oneArg(d, &z.Key)
}

func parseZoneRate(d *caddyfile.Dispenser, z *Zone) error {
	if err := oneArg(d, &z.Rate); err != nil {
		return err
	}
	if _, _, err := limiter.ParseRate(z.Rate); err != nil {
		return d.Errf("zone %q: %v", z.name, err)
	}
	return nil
}

func parseZoneBurst(d *caddyfile.Dispenser, z *Zone) error {
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return d.Errf("zone %q: burst %q: want a whole number of at least 1", z.name, s)
	}
	z.Burst = n
	return nil
}

// oneArg reads the single argument of the current subdirective into dst.
func oneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)
