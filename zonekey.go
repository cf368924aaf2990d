package ratelimit

// A request's client in a zone: its key resolved from the request, and the
// bucket it names (IP addresses grouped by the zone's prefixes).

import (
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/clientkey"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// request is the store request of r in z, with the policy and cost for r;
// false when z's matchers do not match r, or when its key is empty and
// the zone skips empty keys.
func (z *Zone) request(r *http.Request, repl *caddy.Replacer, logger *zap.Logger) (limiter.Request, bool, error) {
	match, err := z.matchers.AnyMatchWithError(r)
	if err != nil {
		return limiter.Request{}, false, fmt.Errorf("zone %q: matching: %w", z.name, err)
	}
	if !match {
		return limiter.Request{}, false, nil
	}
	var req limiter.Request
	if z.fixedKey {
		req = z.fixed
	} else {
		key := z.resolveKey(r, repl, logger)
		if key == "" && z.OnEmptyKey == onEmptyKeySkip {
			return limiter.Request{}, false, nil
		}
		req = z.bucket(key)
	}
	req.Policy, req.Cost = z.limits(repl, logger)
	return req, true, nil
}

// compileKey sets what the zone's Key needs per request: nothing when it
// has no placeholder (its bucket is named here, once), one lookup when it
// is exactly one placeholder, else a template to replace.
func (z *Zone) compileKey() {
	z.fixedKey = !strings.ContainsAny(z.Key, "{}") // ReplaceAll returns such a key as it is
	if z.fixedKey {
		z.fixed = z.bucket(z.Key)
		return
	}
	name, open := strings.CutPrefix(z.Key, "{")
	name, closed := strings.CutSuffix(name, "}")
	if open && closed && name != "" && !strings.ContainsAny(name, "{}\\") {
		z.placeholder = name
	}
	// Two placeholders read straight from the request, as Caddy's replacer
	// reads them, without walking its providers: a header, a variable.
	if field, ok := strings.CutPrefix(z.placeholder, "http.request.header."); ok && field != "" {
		z.header = textproto.CanonicalMIMEHeaderKey(field)
	}
	if v, ok := strings.CutPrefix(z.placeholder, "http.vars."); ok && v != "" {
		z.variable = v
	}
}

// resolveKey is the client key of r: Key with its placeholders
// replaced, unknown ones by nothing (logged once per zone: a key that
// resolves to nothing puts the requests in one bucket). A key that is one
// placeholder is that placeholder's value as ReplaceAll would write it
// (caddy.ToString), taken without building a string around it.
func (z *Zone) resolveKey(r *http.Request, repl *caddy.Replacer, logger *zap.Logger) string {
	switch {
	case z.header != "": // as the replacer: the values joined by commas
		vals := r.Header[z.header]
		if len(vals) == 1 {
			return vals[0]
		}
		return strings.Join(vals, ",")
	case z.variable != "":
		return caddy.ToString(caddyhttp.GetVar(r.Context(), z.variable))
	}
	warned := z.warned[fieldKey].Load()
	if z.placeholder == "" {
		if warned {
			return repl.ReplaceAll(z.Key, "")
		}
		key, err := repl.ReplaceOrErr(z.Key, false, true)
		if err != nil {
			z.warnUnknownKey(logger, err.Error())
			key = repl.ReplaceAll(z.Key, "")
		}
		return key
	}
	v, known := repl.Get(z.placeholder)
	if !known && !warned {
		z.warnUnknownKey(logger, "unknown placeholder {"+z.placeholder+"}")
	}
	return caddy.ToString(v)
}

// warnUnknownKey logs, once per zone, that a placeholder of its key was
// unknown for a request (no handler before this one set it).
func (z *Zone) warnUnknownKey(logger *zap.Logger, why string) {
	if z.warned[fieldKey].CompareAndSwap(false, true) {
		logger.Warn("a placeholder of the zone's key is unknown for a request, and resolves to nothing: "+
			"requests without it share one bucket; check its name, and that the handler that sets it runs before rate_limit (logged once per zone)",
			zap.String("zone", z.name), zap.String("key", z.Key), zap.String("error", why))
	}
}

// bucket is the store request for the bucket of a resolved client key in
// z, with the zone's static (or default) policy and cost. It is the one
// place that turns a key into a bucket's identity: an IP address is
// grouped by the zone's prefixes. Requests and the admin API both name
// buckets through it.
func (z *Zone) bucket(key string) limiter.Request {
	return limiter.Request{Zone: z.name, Key: z.subnet(key), Policy: z.policy, Cost: z.cost, Sync: time.Duration(z.Sync), Global: z.Global}.WithDigest(z.hasher)
}

// subnet is clientkey.Subnet of key with the zone's prefixes, without its
// work where it would give key back: a key that cannot be an address (it
// would fail to parse, at the cost of an error), and an IPv4 address kept
// whole (netip reads only the canonical form, and writes it back).
func (z *Zone) subnet(key string) string {
	v4 := z.IPv4Prefix.bits(defaultIPv4Prefix, 32)
	switch addressShape(key) {
	case notAddress:
		return key
	case digitsAndDots:
		if v4 >= 32 {
			return key
		}
	}
	return clientkey.Subnet(key, v4, z.IPv6Prefix.bits(defaultIPv6Prefix, 128))
}

// The shapes of a key, as addressShape sees them.
const (
	notAddress    = iota // netip.ParseAddr fails on it
	digitsAndDots        // an IPv4 address, or nothing netip reads
	withColons           // an IPv6 address, maybe
)

// addressShape tells from its characters whether key may be an IP
// address. netip.ParseAddr reads an IPv6 address from hex digits, dots
// and colons (then a zone, after '%'), an IPv4 one from digits and dots,
// and nothing else.
func addressShape(key string) int {
	colons, letters := false, false
	for i := 0; i < len(key) && key[i] != '%'; i++ {
		switch c := key[i]; {
		case c == ':':
			colons = true
		case c == '.' || '0' <= c && c <= '9':
		case 'a' <= c|0x20 && c|0x20 <= 'f':
			letters = true
		default:
			return notAddress
		}
	}
	switch {
	case colons:
		return withColons
	case letters:
		return notAddress
	}
	return digitsAndDots
}
