package ratelimit

import (
	"cmp"
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// staticCount is a burst or cost as configured: v's literal value; for a
// template (or nothing), the zone's default_<field>, configured, or else
// builtin, the module's default.
func staticCount(field string, v caddyhttp.WeakString, configured, builtin int64) (int64, error) {
	if configured < 0 {
		return 0, fmt.Errorf("default_%s %d: want at least 1", field, configured)
	}
	if v == "" || hasPlaceholder(string(v)) {
		return cmp.Or(configured, builtin), nil
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s %q: want a whole number of at least 1", field, v)
	}
	return n, nil
}

// dynamicField names a value that a zone may take from placeholders, for
// its warnings: each is logged once per zone.
type dynamicField int

func (f dynamicField) String() string {
	return [...]string{"rate", "burst", "cost", "rate and burst", "cost_from_response", "key", "override", "quota"}[f]
}

// limits are the zone's policy and cost for one request: the static ones,
// or those its placeholders give, falling back to the defaults (with one
// warning per zone and field) when a value is not valid.
func (z *Zone) limits(repl *caddy.Replacer, logger *zap.Logger) (limiter.Policy, int64) {
	if z.static {
		return z.policy, z.cost
	}
	p := z.policy
	if hasPlaceholder(string(z.Quota)) {
		p = z.quotaLimits(p, repl, func(err error) { z.warn(fieldQuota, logger, err) })
	}
	if hasPlaceholder(z.Rate) {
		v := repl.ReplaceAll(z.Rate, "")
		if n, period, err := parseRate(v); err == nil {
			p.Rate, p.Period = n, period
		} else {
			z.warn(fieldRate, logger, fmt.Errorf("rate %s is not a rate such as 100r/m", clip(v)))
		}
		if z.Burst == "" { // the default burst of the rate in force
			p.Burst = bucket.DefaultBurst(p.Algorithm, p.Rate)
		}
	}
	if hasPlaceholder(string(z.Burst)) {
		p.Burst = z.dynamicCount(fieldBurst, logger, z.Burst, repl, cmp.Or(z.DefaultBurst, bucket.DefaultBurst(p.Algorithm, p.Rate)))
	}
	cost := z.dynamicCount(fieldCost, logger, z.Cost, repl, z.cost)
	if err := cmp.Or(p.Validate(), checkAlgorithmLimits(p)); err != nil {
		z.warn(fieldPolicy, logger, err)
		p = z.policy
	}
	return p, cost
}

// dynamicCount resolves a burst or cost template, or keeps def.
func (z *Zone) dynamicCount(f dynamicField, logger *zap.Logger, v caddyhttp.WeakString, repl *caddy.Replacer, def int64) int64 {
	if !hasPlaceholder(string(v)) {
		return def
	}
	s := repl.ReplaceAll(string(v), "")
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		z.warn(f, logger, fmt.Errorf("%s is not a whole number of at least 1", clip(s)))
		return def
	}
	return n
}

// clip is a placeholder's value quoted for a log: what a client sent, of
// any length, perhaps a secret: its first 16 bytes and its length.
func clip(s string) string {
	const most = 16
	if len(s) <= most {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:most]) + "… (" + strconv.Itoa(len(s)) + " bytes)"
}

// warn logs, once per zone and field, that a template gave no valid value.
func (z *Zone) warn(f dynamicField, logger *zap.Logger, err error) {
	if z.warned[f].CompareAndSwap(false, true) {
		logger.Warn("placeholder gave no valid value; using the zone's default (logged once)",
			zap.String("zone", z.name), zap.String("field", f.String()), zap.Error(err))
	}
}

const (
	fieldRate         dynamicField = iota
	fieldBurst                     // a burst template
	fieldCost                      // a cost template
	fieldPolicy                    // rate and burst together (e.g. a leaky bucket's wait)
	fieldResponseCost              // cost_from_response's header
	fieldKey                       // a placeholder of the key unknown for a request
	fieldOverride                  // an override that gives no valid policy
	fieldQuota                     // a quota template
	numDynamicFields
)
