package ratelimit

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
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
//		on_store_error allow | deny [<status>] | local [instances <n>]
//		dry_run
//		dry_run_headers
//		response json | problem | handle_errors
//		headers x_ratelimit | ietf | both | none
//		retry_after_jitter <duration>
//		log_keys
//		jwt {
//			secret          <text>
//			public_key_file <pem file>
//			jwks_file       <json file>
//			from            header <name> | cookie <name>
//			issuer          <iss>
//			audience        <aud>
//			leeway          <duration>
//		}
//		zone <name> {
//			match {
//				<matchers>
//			}
//			key          <template>
//			rate         <N>r/<s|m|h|d> | <template> <default rate>
//			burst        <N> | <template> [<default N>]
//			cost         <N> | <template> [<default N>]
//			ipv4_prefix  <bits>
//			ipv6_prefix  <bits>
//			on_empty_key shared | skip
//			algorithm    token_bucket | fixed_window | sliding_window_log | sliding_window_counter | leaky_bucket
//			nodelay
//			dry_run
//			ban          <refusals> <within> <for>
//		}
//		zone <name> {
//			key            <template>
//			max_concurrent <N>
//			lease          <duration>
//		}
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		var err error
		switch d.Val() {
		case "zone":
			err = h.unmarshalZone(d.NewFromNextSegment())
		case "redis":
			err = h.unmarshalRedis(d)
		case "on_store_error":
			err = h.unmarshalStoreError(d)
		case "jwt":
			err = h.unmarshalJWT(d)
		case "dry_run":
			err = noArgs(d, &h.DryRun)
		case "dry_run_headers":
			err = noArgs(d, &h.DryRunHeaders)
		case "log_keys":
			err = noArgs(d, &h.LogKeys)
		case "response":
			err = oneOf(d, &h.Response, "json", "problem", "handle_errors")
		case "headers":
			err = oneOf(d, &h.Headers, "x_ratelimit", "ietf", "both", "none")
		case "retry_after_jitter":
			err = parseJitter(d, h)
		default:
			err = d.Errf("unrecognized subdirective %q", d.Val())
		}
		if err != nil {
			return err
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
	if err := z.check(); err != nil {
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
	"match":        parseZoneMatch,
	"key":          func(d *caddyfile.Dispenser, z *Zone) error { return oneArg(d, &z.Key) },
	"rate":         parseZoneRate,
	"burst":        func(d *caddyfile.Dispenser, z *Zone) error { return parseCount(d, z, &z.Burst, &z.DefaultBurst) },
	"cost":         func(d *caddyfile.Dispenser, z *Zone) error { return parseCount(d, z, &z.Cost, &z.DefaultCost) },
	"ipv4_prefix":  func(d *caddyfile.Dispenser, z *Zone) error { return parsePrefix(d, z, &z.IPv4Prefix, 32) },
	"ipv6_prefix":  func(d *caddyfile.Dispenser, z *Zone) error { return parsePrefix(d, z, &z.IPv6Prefix, 128) },
	"on_empty_key": parseOnEmptyKey,
	"algorithm":    parseAlgorithm,
	"nodelay":      func(d *caddyfile.Dispenser, z *Zone) error { return noArgs(d, &z.NoDelay) },
	"max_concurrent": func(d *caddyfile.Dispenser, z *Zone) error {
		n := 0
		err := intArg(d, &n, 1)
		z.MaxConcurrent = int64(n)
		return err
	},
	"lease":   parseLease,
	"dry_run": func(d *caddyfile.Dispenser, z *Zone) error { return noArgs(d, &z.DryRun) },
	"ban":     parseBan,
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

// oneOf reads a single argument that must be one of choices.
func oneOf(d *caddyfile.Dispenser, dst *string, choices ...string) error {
	name := d.Val()
	if err := oneArg(d, dst); err != nil {
		return err
	}
	if !slices.Contains(choices, *dst) {
		return d.Errf("%s %q: want %s", name, *dst, strings.Join(choices, ", "))
	}
	return nil
}

func parseJitter(d *caddyfile.Dispenser, h *Handler) error {
	var err error
	h.RetryAfterJitter, err = durationArg(d, 0, "retry_after_jitter %q: want a duration such as 5s")
	return err
}

// durationArg reads a single duration argument of at least min; msg
// (with a %q for the argument) says what is wrong otherwise.
func durationArg(d *caddyfile.Dispenser, min time.Duration, msg string) (caddy.Duration, error) {
	var s string
	if err := oneArg(d, &s); err != nil {
		return 0, err
	}
	t, err := caddy.ParseDuration(s)
	if err != nil || t < min {
		return 0, d.Errf(msg, s)
	}
	return caddy.Duration(t), nil
}

func parseAlgorithm(d *caddyfile.Dispenser, z *Zone) error {
	if err := oneArg(d, &z.Algorithm); err != nil {
		return err
	}
	if _, err := limiter.ParseAlgorithm(z.Algorithm); err != nil {
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

// templateArgs reads "<template> [<default>]" and reports whether the
// template holds placeholders.
func templateArgs(d *caddyfile.Dispenser) (tmpl, dflt string, err error) {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return "", "", d.ArgErr()
	}
	if len(args) == 2 {
		if !hasPlaceholder(args[0]) {
			return "", "", d.Errf("%q has no placeholder: a default is only for placeholders", args[0])
		}
		dflt = args[1]
	}
	return args[0], dflt, nil
}

// parseZoneRate parses: rate <N>r/<unit> | rate <template> <default>.
func parseZoneRate(d *caddyfile.Dispenser, z *Zone) error {
	tmpl, dflt, err := templateArgs(d)
	if err != nil {
		return err
	}
	z.Rate, z.DefaultRate = tmpl, dflt
	check := cmp.Or(dflt, tmpl)
	switch {
	case hasPlaceholder(dflt):
		return d.Errf("zone %q: default rate %q: want a rate, not a placeholder", z.name, dflt)
	case hasPlaceholder(check):
		return d.Errf("zone %q: rate %q has placeholders: give a default rate after it", z.name, tmpl)
	}
	if _, _, err := limiter.ParseRate(check); err != nil {
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

func parsePrefix(d *caddyfile.Dispenser, z *Zone, dst *int, maxBits int) error {
	field := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxBits {
		return d.Errf("zone %q: %s %q: want 1 to %d", z.name, field, s, maxBits)
	}
	*dst = n
	return nil
}

func parseOnEmptyKey(d *caddyfile.Dispenser, z *Zone) error {
	if err := oneArg(d, &z.OnEmptyKey); err != nil {
		return err
	}
	if z.OnEmptyKey != "shared" && z.OnEmptyKey != "skip" {
		return d.Errf("zone %q: on_empty_key %q: want shared or skip", z.name, z.OnEmptyKey)
	}
	return nil
}

// unmarshalRedis parses the redis block.
func (h *Handler) unmarshalRedis(d *caddyfile.Dispenser) error {
	if h.Redis != nil {
		return d.Err("redis is already configured")
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	h.Redis = new(RedisConfig)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		parse, ok := redisOptions[d.Val()]
		if !ok {
			return d.Errf("redis: unrecognized subdirective %q", d.Val())
		}
		if err := parse(d, h.Redis); err != nil {
			return err
		}
	}
	if len(h.Redis.Addresses) == 0 {
		return d.Err("redis: addresses is required")
	}
	return nil
}

// redisOptions parse the subdirectives of the redis block, one each.
var redisOptions = map[string]func(*caddyfile.Dispenser, *RedisConfig) error{
	"addresses": func(d *caddyfile.Dispenser, c *RedisConfig) error {
		c.Addresses = append(c.Addresses, d.RemainingArgs()...)
		if len(c.Addresses) == 0 {
			return d.ArgErr()
		}
		return nil
	},
	"cluster":     func(d *caddyfile.Dispenser, c *RedisConfig) error { return noArgs(d, &c.Cluster) },
	"master_name": func(d *caddyfile.Dispenser, c *RedisConfig) error { return oneArg(d, &c.MasterName) },
	"username":    func(d *caddyfile.Dispenser, c *RedisConfig) error { return oneArg(d, &c.Username) },
	"password":    func(d *caddyfile.Dispenser, c *RedisConfig) error { return oneArg(d, &c.Password) },
	"key_prefix":  parseKeyPrefix,
	"db":          func(d *caddyfile.Dispenser, c *RedisConfig) error { return intArg(d, &c.DB, 0) },
	"pool_size":   func(d *caddyfile.Dispenser, c *RedisConfig) error { return intArg(d, &c.PoolSize, 1) },
	"timeout":     parseRedisTimeout,
	"local_cache": parseLocalCache,
	"tls":         parseRedisTLS,
}

func parseKeyPrefix(d *caddyfile.Dispenser, c *RedisConfig) error {
	if err := oneArg(d, &c.KeyPrefix); err != nil {
		return err
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		return d.Errf("redis: key_prefix %q must not contain { or } (they would choose the cluster slot)", c.KeyPrefix)
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

func parseRedisTLS(d *caddyfile.Dispenser, c *RedisConfig) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	c.TLS = new(RedisTLS)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "ca":
			err = oneArg(d, &c.TLS.CA)
		case "cert":
			err = oneArg(d, &c.TLS.Cert)
		case "key":
			err = oneArg(d, &c.TLS.Key)
		case "server_name":
			err = oneArg(d, &c.TLS.ServerName)
		case "insecure_skip_verify":
			err = noArgs(d, &c.TLS.InsecureSkipVerify)
		default:
			err = d.Errf("redis tls: unrecognized subdirective %q", d.Val())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalJWT parses the jwt block.
func (h *Handler) unmarshalJWT(d *caddyfile.Dispenser) error {
	if h.JWT != nil {
		return d.Err("jwt is already configured")
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	h.JWT = new(JWTConfig)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		parse, ok := jwtOptions[d.Val()]
		if !ok {
			return d.Errf("jwt: unrecognized subdirective %q", d.Val())
		}
		if err := parse(d, h.JWT); err != nil {
			return err
		}
	}
	if h.JWT.Secret == "" && h.JWT.PublicKeyFile == "" && h.JWT.JWKSFile == "" {
		return d.Err("jwt: needs secret, public_key_file or jwks_file")
	}
	return nil
}

// jwtOptions parse the subdirectives of the jwt block, one each.
var jwtOptions = map[string]func(*caddyfile.Dispenser, *JWTConfig) error{
	"secret":          func(d *caddyfile.Dispenser, c *JWTConfig) error { return oneArg(d, &c.Secret) },
	"public_key_file": func(d *caddyfile.Dispenser, c *JWTConfig) error { return oneArg(d, &c.PublicKeyFile) },
	"jwks_file":       func(d *caddyfile.Dispenser, c *JWTConfig) error { return oneArg(d, &c.JWKSFile) },
	"issuer":          func(d *caddyfile.Dispenser, c *JWTConfig) error { return oneArg(d, &c.Issuer) },
	"audience":        func(d *caddyfile.Dispenser, c *JWTConfig) error { return oneArg(d, &c.Audience) },
	"from":            parseJWTFrom,
	"leeway":          parseJWTLeeway,
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

// unmarshalStoreError parses: on_store_error allow | deny [<status>] |
// local [instances <n>].
func (h *Handler) unmarshalStoreError(d *caddyfile.Dispenser) error {
	if h.OnStoreError != nil {
		return d.Err("on_store_error is already set")
	}
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.ArgErr()
	}
	p := &StoreErrorPolicy{Mode: args[0]}
	h.OnStoreError = p
	switch {
	case args[0] == "allow" && len(args) == 1:
	case args[0] == "deny" && len(args) <= 2:
		if len(args) == 2 {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 400 || n > 599 {
				return d.Errf("on_store_error deny: status %q: want an error status, 400-599", args[1])
			}
			p.Status = n
		}
	case args[0] == "local" && (len(args) == 1 || len(args) == 3 && args[1] == "instances"):
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

// noArgs sets a flag subdirective, which takes no argument.
func noArgs(d *caddyfile.Dispenser, dst *bool) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	*dst = true
	return nil
}

// intArg reads a single whole-number argument of at least min.
func intArg(d *caddyfile.Dispenser, dst *int, min int) error {
	name, s := d.Val(), ""
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < min {
		return d.Errf("%s %q: want a whole number of at least %d", name, s, min)
	}
	*dst = n
	return nil
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*Handler)(nil)
