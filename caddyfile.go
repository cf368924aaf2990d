package ratelimit

import (
	"cmp"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	// Before basic_auth (and its old name basicauth): password guessing is
	// limited too, and every handler that answers requests comes later.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basicauth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	rl := new(Handler)
	if err := rl.UnmarshalCaddyfile(h.Dispenser); err != nil {
		return nil, err
	}
	return rl, checkZoneNames(h, rl) // zonenames.go
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	rate_limit [<matcher>] {
//		redis {
//			addresses   <host:port>...
//			cluster
//			master_name <name>
//			username    <user>
//			password    <password>
//			db          <n>
//			tls {
//				ca                   <pem file>
//				cert                 <pem file>
//				key                  <pem file>
//				server_name          <name>
//				insecure_skip_verify
//			}
//			key_prefix  <text>
//			pool_size   <n>
//			timeout     <duration>
//			local_cache <n> | off
//		}
//		regions <this region> {
//			<region> {
//				<what redis takes>
//			}
//			sync <interval>
//		}
//		on_store_error allow | deny [<status>] | local [instances <n>]
//		dry_run
//		dry_run_headers
//		response json | problem | handle_errors
//		headers x_ratelimit | ietf | both | none
//		retry_after_jitter <duration>
//		log_keys
//		log_refusals [<interval> | off]
//		memory_capacity <n>
//		jitter          <fraction>
//		log_key
//		disable_metrics
//		sweep_interval  <duration>
//		jwt {
//			secret          <text>
//			public_key_file <pem file>
//			jwks_file       <json file>
//			jwks_url        <https url>
//			from            header <name> | cookie <name>
//			issuer          <iss> [discover]
//			audience        <aud>
//			leeway          <duration>
//			refresh_min     <duration>
//			refresh_max     <duration>
//			max_stale       <duration>
//			fetch_timeout   <duration>
//		}
//		zone <name> {
//			match {
//				<matchers>
//			}
//			key          <template>
//			rate         <N>r/<s|m|h|d> | <template> <default rate>
//			events       <N>
//			window       <duration>
//			burst        <N> | <template> [<default N>]
//			cost         <N> | <template> [<default N>]
//			ipv4_prefix  <bits> | 0
//			ipv6_prefix  <bits> | 0
//			on_empty_key shared | skip
//			algorithm    token_bucket | fixed_window | sliding_window_log | sliding_window_counter | leaky_bucket
//			nodelay
//			dry_run
//			ban          <refusals> <within> <for>
//			global
//		}
//		zone <name> {
//			key       <template>
//			quota     <N> | <template> per day|week|month|year [<default N>]
//			time_zone <IANA name>
//		}
//		zone <name> {
//			key            <template>
//			max_concurrent <N>
//			lease          <duration>
//		}
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	err := cmp.Or(parseBlock(d, "", h, handlerOptions), checkConstantKeys(h), checkCaddyfileRegions(h))
	if err == nil && len(h.Zones) == 0 {
		err = d.Err("rate_limit needs at least one zone")
	}
	return err
}

// parseBlock parses "<name> { ... }" from d: the name, which takes no
// arguments, and its block (see parseSubdirectives).
func parseBlock[T any](d *caddyfile.Dispenser, what string, dst T, options map[string]func(*caddyfile.Dispenser, T) error) error {
	d.Next() // the name
	if d.NextArg() {
		return d.ArgErr()
	}
	return parseSubdirectives(d, what, dst, options)
}

// parseSubdirectives parses the subdirectives of the block that follows
// d's current token, each with its entry in options; an unknown one is an
// error that starts with what (e.g. "redis: ").
func parseSubdirectives[T any](d *caddyfile.Dispenser, what string, dst T, options map[string]func(*caddyfile.Dispenser, T) error) error {
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		parse, ok := options[d.Val()]
		if !ok {
			return d.Errf("%sunrecognized subdirective %q%s", what, d.Val(), didYouMean(d.Val(), maps.Keys(options)))
		}
		if seen, ok := any(dst).(interface{ saw(caddyfile.Token) }); ok {
			seen.saw(d.Token())
		}
		if err := parse(d, dst); err != nil {
			return err
		}
	}
	return nil
}

// handlerOptions parse the subdirectives of rate_limit, one each. A
// sub-config parses its own block from a dispenser of its own.
var handlerOptions = map[string]func(*caddyfile.Dispenser, *Handler) error{
	"zone": unmarshalZone,
	"redis": func(d *caddyfile.Dispenser, h *Handler) error {
		return unmarshalOnce(d, &h.Redis, "redis is already configured")
	},
	"on_store_error": func(d *caddyfile.Dispenser, h *Handler) error {
		return unmarshalOnce(d, &h.OnStoreError, "on_store_error is already set")
	},
	"jwt": func(d *caddyfile.Dispenser, h *Handler) error {
		return unmarshalOnce(d, &h.JWT, "jwt is already configured")
	},
	"regions": func(d *caddyfile.Dispenser, h *Handler) error { // regions.go
		return unmarshalOnce(d, &h.Regions, "regions is already configured: give one regions block, with every other region in it")
	},
	"dry_run":            func(d *caddyfile.Dispenser, h *Handler) error { return noArgs(d, &h.DryRun) },
	"dry_run_headers":    func(d *caddyfile.Dispenser, h *Handler) error { return noArgs(d, &h.DryRunHeaders) },
	"log_keys":           func(d *caddyfile.Dispenser, h *Handler) error { return noArgs(d, &h.LogKeys) },
	"response":           func(d *caddyfile.Dispenser, h *Handler) error { return oneOf(d, &h.Response, responseChoices) },
	"headers":            func(d *caddyfile.Dispenser, h *Handler) error { return oneOf(d, &h.Headers, headersChoices) },
	"retry_after_jitter": parseJitter,
	"log_refusals":       parseLogRefusals,
	"overrides_poll": func(d *caddyfile.Dispenser, h *Handler) error {
		var err error
		h.OverridesPoll, err = durationArg(d, 100*time.Millisecond, "overrides_poll %q: want an interval of at least 100ms, such as 10s")
		return err
	},
	"memory_capacity": func(d *caddyfile.Dispenser, h *Handler) error {
		return intArg(d, &h.MemoryCapacity, limiter.MinMemoryCapacity)
	},
	// caddy-ratelimit's options (compat.go, distributed.go)
	"log_key":         func(d *caddyfile.Dispenser, h *Handler) error { return noArgs(d, &h.LogKeys) },
	"disable_metrics": func(d *caddyfile.Dispenser, h *Handler) error { return noArgs(d, &h.DisableMetrics) },
	"jitter":          parseFractionJitter,
	"sweep_interval": func(d *caddyfile.Dispenser, h *Handler) error {
		var err error
		h.SweepInterval, err = durationArg(d, 1, "sweep_interval %q: want a positive duration such as 1m")
		return err
	},
	"distributed": parseDistributed,
	"storage":     parseStorage,
}

// parseLogRefusals parses: log_refusals [<interval> | off].
func parseLogRefusals(d *caddyfile.Dispenser, h *Handler) error {
	h.LogRefusals = new(RefusalLog)
	if d.CountRemainingArgs() == 0 {
		return nil
	}
	if d.NextArg() && d.Val() == "off" {
		h.LogRefusals.Off = true
		if d.NextArg() {
			return d.ArgErr()
		}
		return nil
	}
	d.Prev() // the interval, for durationArg
	var err error
	h.LogRefusals.Interval, err = durationArg(d, 1, "log_refusals %q: want an interval such as 1m, or off")
	return err
}

// parseFractionJitter parses caddy-ratelimit's jitter <fraction>.
func parseFractionJitter(d *caddyfile.Dispenser, h *Handler) error {
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	j, err := strconv.ParseFloat(s, 64)
	if err != nil || !(j >= 0 && j <= maxJitter) {
		return d.Errf("jitter %q: want a fraction of the wait from 0 to %d (0.2 adds up to 20%%)", s, maxJitter)
	}
	h.Jitter = j
	return nil
}

// UnmarshalCaddyfile parses a redis block (see Handler.UnmarshalCaddyfile).
func (c *RedisConfig) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	err := parseBlock(d, "redis: ", c, redisOptions)
	if err == nil && len(c.Addresses) == 0 {
		err = d.Err("redis: addresses is required")
	}
	return err
}

// redisOptions parse the subdirectives of the redis block, one each.
var redisOptions = withStringOptions(map[string]func(*caddyfile.Dispenser, *RedisConfig) error{
	"addresses": func(d *caddyfile.Dispenser, c *RedisConfig) error {
		c.Addresses = append(c.Addresses, d.RemainingArgs()...)
		if len(c.Addresses) == 0 {
			return d.ArgErr()
		}
		return nil
	},
	"cluster":     func(d *caddyfile.Dispenser, c *RedisConfig) error { return noArgs(d, &c.Cluster) },
	"key_prefix":  parseKeyPrefix,
	"db":          func(d *caddyfile.Dispenser, c *RedisConfig) error { return intArg(d, &c.DB, 0) },
	"pool_size":   func(d *caddyfile.Dispenser, c *RedisConfig) error { return intArg(d, &c.PoolSize, 1) },
	"timeout":     parseRedisTimeout,
	"local_cache": parseLocalCache,
	"tls": func(d *caddyfile.Dispenser, c *RedisConfig) error {
		c.TLS = new(RedisTLS)
		return c.TLS.UnmarshalCaddyfile(d.NewFromNextSegment())
	},
}, "master_name", "username", "password", "key_secret")

func parseKeyPrefix(d *caddyfile.Dispenser, c *RedisConfig) error {
	if err := oneArg(d, &c.KeyPrefix); err != nil {
		return err
	}
	if err := checkKeyPrefix(c.KeyPrefix); err != nil {
		return d.Errf("redis: %v", err)
	}
	return nil
}

// parseLocalCache parses: local_cache <n> | off.
func parseLocalCache(d *caddyfile.Dispenser, c *RedisConfig) error {
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	if s == "off" {
		c.LocalCache = -1
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return d.Errf("redis: local_cache %q: want a number of clients, or off", s)
	}
	c.LocalCache = n
	return nil
}

func parseRedisTimeout(d *caddyfile.Dispenser, c *RedisConfig) error {
	var err error
	c.Timeout, err = durationArg(d, 1, "redis: timeout %q: want a positive duration such as 100ms")
	return err
}

// UnmarshalCaddyfile parses the tls block of redis.
func (t *RedisTLS) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseBlock(d, "redis tls: ", t, redisTLSOptions)
}

// redisTLSOptions parse the subdirectives of redis's tls block, one each.
var redisTLSOptions = withStringOptions(map[string]func(*caddyfile.Dispenser, *RedisTLS) error{
	"insecure_skip_verify": func(d *caddyfile.Dispenser, t *RedisTLS) error { return noArgs(d, &t.InsecureSkipVerify) },
}, "ca", "cert", "key", "server_name")

// UnmarshalCaddyfile parses a jwt block (see Handler.UnmarshalCaddyfile),
// and checks its keys' settings, so that errors point at its first line.
func (c *JWTConfig) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if err := parseBlock(d, "jwt: ", c, jwtOptions); err != nil {
		return err
	}
	d.Reset()
	d.Next()
	if c.Secret == "" && c.PublicKeyFile == "" && c.JWKSFile == "" && c.JWKSURL == "" && !c.Discover {
		return d.Err("jwt: needs secret, public_key_file, jwks_file, jwks_url or issuer <url> discover")
	}
	if _, err := c.remoteOptions(); err != nil {
		return d.Errf("jwt: %v", err)
	}
	return nil
}

// jwtOptions parse the subdirectives of the jwt block, one each.
var jwtOptions = withStringOptions(map[string]func(*caddyfile.Dispenser, *JWTConfig) error{
	"from":          parseJWTFrom,
	"leeway":        parseJWTLeeway,
	"issuer":        parseJWTIssuer,
	"refresh_min":   parseJWTDuration,
	"refresh_max":   parseJWTDuration,
	"max_stale":     parseJWTDuration,
	"fetch_timeout": parseJWTDuration,
}, "secret", "public_key_file", "jwks_file", "jwks_url", "audience")

// parseJWTIssuer parses: issuer <iss> [discover].
func parseJWTIssuer(d *caddyfile.Dispenser, c *JWTConfig) error {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 || len(args) == 2 && args[1] != "discover" {
		return d.Err("jwt: want issuer <iss> or issuer <url> discover")
	}
	c.Issuer, c.Discover = args[0], len(args) == 2
	return nil
}

// parseJWTDuration parses refresh_min, refresh_max, max_stale or
// fetch_timeout: a positive duration.
func parseJWTDuration(d *caddyfile.Dispenser, c *JWTConfig) error {
	dst := map[string]*caddy.Duration{"refresh_min": &c.RefreshMin, "refresh_max": &c.RefreshMax,
		"max_stale": &c.MaxStale, "fetch_timeout": &c.FetchTimeout}[d.Val()]
	var err error
	*dst, err = durationArg(d, 1, "jwt: "+d.Val()+" %q: want a positive duration such as 5m")
	return err
}

// parseJWTFrom parses: from header <name> | from cookie <name>.
func parseJWTFrom(d *caddyfile.Dispenser, c *JWTConfig) error {
	args := d.RemainingArgs()
	if len(args) != 2 || (args[0] != "header" && args[0] != "cookie") {
		return d.Err("jwt: want from header <name> or from cookie <name>")
	}
	c.FromHeader, c.FromCookie = "", ""
	if args[0] == "header" {
		c.FromHeader = args[1]
	} else {
		c.FromCookie = args[1]
	}
	return nil
}

func parseJWTLeeway(d *caddyfile.Dispenser, c *JWTConfig) error {
	leeway, err := durationArg(d, 0, "jwt: leeway %q: want a duration such as 30s")
	c.Leeway = &leeway
	return err
}

// UnmarshalCaddyfile parses: on_store_error allow | deny [<status>] |
// local [instances <n>].
func (p *StoreErrorPolicy) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "on_store_error"
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Err("on_store_error takes no block")
	}
	p.Mode = args[0]
	switch {
	case args[0] == storeErrorAllow && len(args) == 1:
	case args[0] == storeErrorDeny && len(args) <= 2:
		if len(args) == 2 {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 400 || n > 599 {
				return d.Errf("on_store_error deny: status %q: want an error status, 400-599", args[1])
			}
			p.Status = n
		}
	case args[0] == storeErrorLocal && (len(args) == 1 || len(args) == 3 && args[1] == "instances"):
		if len(args) == 3 {
			n, err := strconv.Atoi(args[2])
			if err != nil || n < 1 {
				return d.Errf("on_store_error local: instances %q: want a whole number of at least 1", args[2])
			}
			p.Instances = n
		}
	default:
		return d.Errf("on_store_error: want allow, deny [<status>] or local [instances <n>], got %q", strings.Join(args, " "))
	}
	return nil
}

// Interface guards.
var (
	_ caddyfile.Unmarshaler = (*Handler)(nil)
	_ caddyfile.Unmarshaler = (*Zone)(nil)
	_ caddyfile.Unmarshaler = (*RedisConfig)(nil)
	_ caddyfile.Unmarshaler = (*RedisTLS)(nil)
	_ caddyfile.Unmarshaler = (*JWTConfig)(nil)
	_ caddyfile.Unmarshaler = (*StoreErrorPolicy)(nil)
)
