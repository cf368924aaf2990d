// Package ratelimit is a Caddy HTTP handler that limits the rate of
// requests per client: token buckets keyed by Caddy placeholders, kept in
// memory or shared by a fleet of Caddy instances.
package ratelimit

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/clientkey"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
	redis.SetLogger(redisLogger{})
}

// Handler limits the rate of requests. Each zone is a token bucket per
// client key: every request that matches the zone takes one token; a
// request that finds its bucket empty is answered 429 Too Many Requests
// and does not reach the next handler.
//
// Responses of requests that passed through a zone carry X-RateLimit-Limit
// (the burst), X-RateLimit-Remaining and X-RateLimit-Reset (Unix seconds
// when the bucket is full again) of the most restrictive zone; refusals
// also carry Retry-After (seconds) and a JSON body.
//
// The placeholders {http.rate_limit.zone}, {http.rate_limit.limit},
// {http.rate_limit.remaining}, {http.rate_limit.reset},
// {http.rate_limit.retry_after} and {http.rate_limit.exceeded} describe the
// decision to later handlers and logs.
type Handler struct {
	// Zones are the limits, by name. Every zone whose matchers match the
	// request is checked, all or nothing: a request refused by one zone
	// uses no tokens in the others. Zone names are global: handlers in
	// different sites or routes that name the same zone share its buckets.
	Zones map[string]*Zone `json:"zones,omitempty"`

	// Redis keeps the buckets in Redis, so that every Caddy instance using
	// the same Redis (and key prefix) enforces one limit. Default: buckets
	// are kept in this process's memory.
	Redis *RedisConfig `json:"redis,omitempty"`

	// OnStoreError is what happens to a request when Redis fails or does
	// not answer within its timeout. Only with Redis. Default: local.
	OnStoreError *StoreErrorPolicy `json:"on_store_error,omitempty"`

	// JWT verifies the request's bearer token and makes its claims
	// placeholders: {http.rate_limit.jwt.sub}, and nested claims by path,
	// {http.rate_limit.jwt.org.id}. Zones use them in keys, rates, bursts
	// and costs; later handlers and logs may use them too. The token is
	// verified once per request, and only when a claim is asked for. A
	// token that fails verification (signature, algorithm, exp, nbf, iss,
	// aud) yields no claims.
	JWT *JWTConfig `json:"jwt,omitempty"`

	// DryRun computes, counts and logs (at debug level) the decisions of
	// every zone but never refuses a request: for rolling out new rules.
	// A zone can be in dry run on its own.
	DryRun bool `json:"dry_run,omitempty"`

	// DryRunHeaders lets dry-run zones set the limit headers (never
	// Retry-After) when they are the most restrictive, so that clients see
	// the coming limits before they are enforced. Default: dry-run zones
	// set no headers.
	DryRunHeaders bool `json:"dry_run_headers,omitempty"`

	// Response is how a refusal is answered: "json" (the default: a JSON
	// body), "problem" (an RFC 9457 application/problem+json body), or
	// "handle_errors" (a 429 error handed to the site's handle_errors
	// routes, which can use the {http.rate_limit.*} placeholders).
	Response string `json:"response,omitempty"`

	// Headers are the rate limit headers sent: "x_ratelimit" (the default:
	// X-RateLimit-Limit, -Remaining and -Reset), "ietf" (RateLimit-Policy
	// and RateLimit, as the IETF httpapi draft), "both", or "none".
	// Retry-After is always sent with a refusal.
	Headers string `json:"headers,omitempty"`

	// RetryAfterJitter adds a random 0 to this much to Retry-After, so
	// that refused clients do not all come back at once. Default: 0.
	RetryAfterJitter caddy.Duration `json:"retry_after_jitter,omitempty"`

	// LogKeys adds the client key to the debug log of refused requests.
	// Keys may be personal data (addresses, user ids) or secrets (API
	// keys), so they are left out by default.
	LogKeys bool `json:"log_keys,omitempty"`

	zones    []*Zone
	verifier *clientkey.Verifier
	backend  *backend
	poolKey  string
	timeout  time.Duration
	onError  StoreErrorPolicy
	now      func() time.Time
	logger   *zap.Logger
}

// JWTConfig says which tokens to trust and where to find them. At least
// one of Secret, PublicKeyFile and JWKSFile is required. Tokens must carry
// exp. The accepted
// algorithms follow from the keys: HS256/384/512 with the secret, RS*/PS*,
// ES* and EdDSA with public keys of their kind; never "none", and never an
// HMAC signature made with a public key.
type JWTConfig struct {
	// Secret verifies HMAC tokens; at least 32 bytes. Placeholders such
	// as {env.JWT_SECRET} work; an unknown placeholder is an error.
	Secret string `json:"secret,omitempty"`

	// PublicKeyFile is a PEM file of RSA, ECDSA or Ed25519 public keys
	// (or certificates).
	PublicKeyFile string `json:"public_key_file,omitempty"`

	// JWKSFile is a JSON Web Key Set file; a token's kid picks the key.
	JWKSFile string `json:"jwks_file,omitempty"`

	// FromHeader is the request header that carries the token, with or
	// without a "Bearer " prefix. Default: Authorization.
	FromHeader string `json:"from_header,omitempty"`

	// FromCookie reads the token from this cookie instead of a header.
	FromCookie string `json:"from_cookie,omitempty"`

	// Issuer, when set, must equal the token's iss claim.
	Issuer string `json:"issuer,omitempty"`

	// Audience, when set, must be one of the token's aud values.
	Audience string `json:"audience,omitempty"`

	// Leeway tolerates clock differences when checking exp and nbf.
	// Default: 30s.
	Leeway *caddy.Duration `json:"leeway,omitempty"`
}

// BanConfig bans a zone's repeat offenders.
type BanConfig struct {
	// After is how many refusals ban a client.
	After int64 `json:"after,omitempty"`
	// Within is the window the refusals are counted in.
	Within caddy.Duration `json:"within,omitempty"`
	// For is how long a ban lasts.
	For caddy.Duration `json:"for,omitempty"`
}

// StoreErrorPolicy says what a handler does while its Redis fails.
type StoreErrorPolicy struct {
	// Mode is one of:
	//   - "local" (the default): each Caddy instance enforces every zone on
	//     its own, in memory, with the rate and burst divided by Instances;
	//   - "allow": requests pass unlimited (fail open);
	//   - "deny": requests are refused with Status (fail closed).
	Mode string `json:"mode,omitempty"`

	// Status is the HTTP status of requests refused in deny mode.
	// Default: 503.
	Status int `json:"status,omitempty"`

	// Instances divides the rate and burst of every zone in local mode: the
	// number of Caddy instances sharing the limit. Default: 1.
	Instances int `json:"instances,omitempty"`
}

// Zone is one limit: a token bucket per client key.
type Zone struct {
	// Match limits the zone to the requests that match any of these
	// matcher sets, e.g. one path. Default: every request.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// Key is the template of the client key, with placeholders such as
	// {client_ip} or {http.request.header.X-API-Key}; each distinct value
	// has its own bucket. Unknown placeholders resolve to nothing; a static
	// key makes one bucket shared by all. Required.
	Key string `json:"key,omitempty"`

	// Rate is the sustained rate, "<N>r/<unit>" with unit s, m, h or d,
	// optionally with a multiplier: "100r/m", "5r/s", "30r/10m". Required.
	Rate string `json:"rate,omitempty"`

	// DefaultRate is the rate when Rate holds placeholders (e.g. a plan
	// set by the map directive or read from a JWT claim) that resolve to
	// something that is not a rate; a warning is logged once. Required when
	// Rate holds placeholders.
	DefaultRate string `json:"default_rate,omitempty"`

	// Burst is the capacity of the bucket: how many requests may come at
	// once after a quiet period. A number or a placeholder. Default: N of
	// the rate.
	Burst caddyhttp.WeakString `json:"burst,omitempty"`

	// DefaultBurst is the burst when Burst holds placeholders that resolve
	// to no whole number of at least 1. Default: N of the rate.
	DefaultBurst int64 `json:"default_burst,omitempty"`

	// Cost is the number of tokens a request takes, e.g. 5 for an
	// expensive search. A number or a placeholder. A request that costs
	// more than the burst is always refused. Default: 1.
	Cost caddyhttp.WeakString `json:"cost,omitempty"`

	// DefaultCost is the cost when Cost holds placeholders that resolve to
	// no whole number of at least 1. Default: 1.
	DefaultCost int64 `json:"default_cost,omitempty"`

	// IPv4Prefix groups keys that are IPv4 addresses by network: with 24,
	// every address of a /24 shares one bucket. Default: 32 (each address
	// alone).
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix groups keys that are IPv6 addresses by network, so that a
	// client cannot escape its limit by rotating addresses inside its own
	// subnet. Default: 64 (one bucket per /64, the usual end-site subnet).
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// Algorithm is how the zone counts: "token_bucket" (the default),
	// "fixed_window", "sliding_window_log", "sliding_window_counter" or
	// "leaky_bucket". For the windows, the rate gives the window and its
	// limit ("100r/m": 100 per minute), and burst does not apply. For the
	// leaky bucket (nginx's limit_req), requests leave at the rate, up to
	// Burst more wait for their turn (default 0), the rest are refused.
	Algorithm string `json:"algorithm,omitempty"`

	// NoDelay lets a leaky bucket's burst through at once instead of
	// spacing it out, as nginx's nodelay.
	NoDelay bool `json:"nodelay,omitempty"`

	// MaxConcurrent limits the requests of a key in flight at once,
	// instead of a rate: a slot is taken when the request comes and given
	// back when its response ends (also when the client goes away).
	MaxConcurrent int64 `json:"max_concurrent,omitempty"`

	// Lease is, in Redis, how long a concurrency slot lives: a Caddy that
	// crashes with requests in flight holds their slots no longer. Longer
	// than any request should take. Default: 5m.
	Lease caddy.Duration `json:"lease,omitempty"`

	// DryRun computes, counts and logs the zone's decisions but never
	// refuses a request because of it, and sets no headers.
	DryRun bool `json:"dry_run,omitempty"`

	// Ban refuses repeat offenders for a while: a client refused After
	// times within Within is refused for For, whatever its bucket holds,
	// with a Retry-After of the ban's remaining time. With Redis, bans are
	// shared by the fleet. Default: no bans.
	Ban *BanConfig `json:"ban,omitempty"`

	// OnEmptyKey is what happens when Key resolves to nothing (no such
	// header, no valid token): "shared" counts all such requests in one
	// bucket of the zone, so that leaving the header out cannot escape the
	// limit; "skip" leaves the request to the other zones. Default: shared.
	OnEmptyKey string `json:"on_empty_key,omitempty"`

	name     string
	matchers caddyhttp.MatcherSets
	static   bool           // no placeholders in rate, burst and cost
	policy   limiter.Policy // the static policy, or the defaults
	cost     int64
	warned   [4]atomic.Bool // rate, burst, cost, their combination
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets up the zones and acquires the store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if h.now == nil {
		h.now = time.Now
	}
	err := h.provisionStoreErrorPolicy()
	if err != nil {
		return err
	}
	if err = h.checkResponseOptions(); err != nil {
		return err
	}
	if err = registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	if h.JWT != nil {
		var skipped []string
		if h.verifier, skipped, err = h.JWT.verifier(); err != nil {
			return fmt.Errorf("jwt: %w", err)
		}
		for _, why := range skipped {
			h.logger.Warn("jwks key skipped", zap.String("file", h.JWT.JWKSFile), zap.String("key", why))
		}
	}
	for _, name := range sortedNames(h.Zones) {
		z := h.Zones[name]
		if err = z.provision(ctx, name); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		if _, err = localPolicy(z.policy, h.onError.Instances); err != nil {
			return fmt.Errorf("zone %q: on_store_error local instances %d: %w", name, h.onError.Instances, err)
		}
		h.zones = append(h.zones, z)
	}
	if h.Redis == nil {
		err = h.loadBackend(memoryPoolKey, newMemoryBackend)
	} else {
		err = h.provisionRedis()
	}
	if err == nil {
		registerZones(h)
	}
	return err
}

// checkResponseOptions checks response, headers and retry_after_jitter.
func (h *Handler) checkResponseOptions() error {
	switch {
	case !slices.Contains([]string{"", "json", "problem", "handle_errors"}, h.Response):
		return fmt.Errorf("response %q: want json, problem or handle_errors", h.Response)
	case !slices.Contains([]string{"", "x_ratelimit", "ietf", "both", "none"}, h.Headers):
		return fmt.Errorf("headers %q: want x_ratelimit, ietf, both or none", h.Headers)
	case h.RetryAfterJitter < 0 || h.RetryAfterJitter > 0 && time.Duration(h.RetryAfterJitter) < time.Second:
		return fmt.Errorf("retry_after_jitter %s: want 0 or at least 1s (Retry-After counts whole seconds)", time.Duration(h.RetryAfterJitter))
	}
	return nil
}

// provisionStoreErrorPolicy checks on_store_error and fills its defaults.
func (h *Handler) provisionStoreErrorPolicy() error {
	if h.OnStoreError != nil {
		if h.Redis == nil {
			return fmt.Errorf("on_store_error applies only with redis")
		}
		h.onError = *h.OnStoreError
	}
	p := &h.onError
	p.Mode = cmp.Or(p.Mode, "local")
	p.Status = cmp.Or(p.Status, http.StatusServiceUnavailable)
	p.Instances = cmp.Or(p.Instances, 1)
	switch {
	case p.Mode != "local" && p.Mode != "allow" && p.Mode != "deny":
		return fmt.Errorf("on_store_error: unknown mode %q (want allow, deny or local)", p.Mode)
	case p.Status < 400 || p.Status > 599:
		return fmt.Errorf("on_store_error: status %d is not an error status (400-599)", p.Status)
	case p.Instances < 1 || p.Instances > 10000:
		return fmt.Errorf("on_store_error: instances %d: want 1 to 10000", p.Instances)
	}
	return nil
}

// localPolicy is a zone's share of its limit on one of n instances: the
// rate divided by n (windows keep their length, buckets refill n times
// slower), and the burst or the slots divided by n, at least 1.
func localPolicy(p limiter.Policy, n int) (limiter.Policy, error) {
	local := p
	switch {
	case p.Algorithm == limiter.Concurrency:
	case p.Algorithm.Windowed():
		local.Rate = max(p.Rate/int64(n), 1)
	case float64(p.Period)*float64(n) > float64(limiter.MaxPeriod):
		return p, fmt.Errorf("period %s times %d is longer than %s", p.Period, n, limiter.MaxPeriod)
	default:
		local.Period = p.Period * time.Duration(n)
	}
	local.Burst = max(p.Burst/int64(n), min(p.Burst, 1))
	if p.Algorithm.Windowed() {
		local.Burst = local.Rate
	}
	return local, local.Validate()
}

func sortedNames(zones map[string]*Zone) []string {
	names := make([]string, 0, len(zones))
	for name := range zones {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

func (z *Zone) provision(ctx caddy.Context, name string) error {
	if z == nil {
		return fmt.Errorf("empty zone")
	}
	z.name = name
	if err := z.check(); err != nil {
		return err
	}
	if z.MatcherSetsRaw == nil {
		return nil
	}
	mods, err := ctx.LoadModule(z, "MatcherSetsRaw")
	if err != nil {
		return fmt.Errorf("loading matchers: %w", err)
	}
	return z.matchers.FromInterface(mods)
}

// hasPlaceholder reports whether s is a template rather than a literal.
func hasPlaceholder(s string) bool { return strings.Contains(s, "{") }

// check validates the zone's fields and computes its static (or default)
// policy and cost.
func (z *Zone) check() error {
	switch {
	case z.name == "":
		return fmt.Errorf("zone has no name")
	case strings.Trim(z.name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") != "":
		return fmt.Errorf("zone name %q: use letters, digits, '_', '-' and '.'", z.name)
	case z.Key == "":
		return fmt.Errorf("key is required")
	case z.OnEmptyKey != "" && z.OnEmptyKey != "shared" && z.OnEmptyKey != "skip":
		return fmt.Errorf("on_empty_key %q: want shared or skip", z.OnEmptyKey)
	case z.IPv4Prefix < 0 || z.IPv4Prefix > 32:
		return fmt.Errorf("ipv4_prefix %d: want 1 to 32", z.IPv4Prefix)
	case z.IPv6Prefix < 0 || z.IPv6Prefix > 128:
		return fmt.Errorf("ipv6_prefix %d: want 1 to 128", z.IPv6Prefix)
	case z.MaxConcurrent != 0:
		return z.checkConcurrency()
	case z.Rate == "":
		return fmt.Errorf("rate (or max_concurrent) is required")
	}
	algo, err := limiter.ParseAlgorithm(z.Algorithm)
	if err != nil {
		return err
	}
	if err := z.checkAlgorithmOptions(algo); err != nil {
		return err
	}
	z.static = !hasPlaceholder(z.Rate) && !hasPlaceholder(string(z.Burst)) && !hasPlaceholder(string(z.Cost))
	rate := z.Rate
	if hasPlaceholder(rate) {
		if z.DefaultRate == "" {
			return fmt.Errorf("rate %q has placeholders: default_rate is required", rate)
		}
		rate = z.DefaultRate
	}
	n, period, err := limiter.ParseRate(rate)
	if err != nil {
		return err
	}
	z.policy = limiter.Policy{Algorithm: algo, Rate: n, Period: period, Burst: n, NoDelay: z.NoDelay}
	if z.policy.Burst, err = staticCount("burst", z.Burst, z.DefaultBurst, defaultBurst(algo, n)); err != nil {
		return err
	}
	if z.cost, err = staticCount("cost", z.Cost, z.DefaultCost, 1); err != nil {
		return err
	}
	if z.cost > z.policy.Limit() && !hasPlaceholder(string(z.Burst)) && !hasPlaceholder(z.Rate) {
		return fmt.Errorf("cost %d is more than the limit, %d: every request would be refused", z.cost, z.policy.Limit())
	}
	if err := checkAlgorithmLimits(z.policy); err != nil {
		return err
	}
	if err := z.checkBan(); err != nil {
		return err
	}
	return z.policy.Validate()
}

// checkBan sets up the zone's ban.
func (z *Zone) checkBan() error {
	if z.Ban == nil {
		return nil
	}
	z.policy.Ban = limiter.Ban{After: z.Ban.After, Within: time.Duration(z.Ban.Within), For: time.Duration(z.Ban.For)}
	if z.Ban.After < 1 {
		return fmt.Errorf("ban: after %d: want at least 1 refusal", z.Ban.After)
	}
	return z.policy.Ban.Validate()
}

// maxLeakyWait bounds how long a leaky bucket may hold a request.
const maxLeakyWait = time.Minute

// maxLogLimit bounds a sliding log's limit: the log keeps one entry per
// request counted.
const maxLogLimit = 10000

// checkAlgorithmLimits refuses policies that would hold requests or
// memory without bound.
func checkAlgorithmLimits(p limiter.Policy) error {
	switch {
	case p.Algorithm == limiter.LeakyBucket && !p.NoDelay && time.Duration(float64(p.Burst)*p.Interval()) > maxLeakyWait:
		return fmt.Errorf("leaky_bucket: burst %d at %s makes requests wait up to %s; at most %s (lower the burst, or use nodelay)",
			p.Burst, p, time.Duration(float64(p.Burst)*p.Interval()).Round(time.Second), maxLeakyWait)
	case p.Algorithm == limiter.SlidingWindowLog && p.Rate > maxLogLimit:
		return fmt.Errorf("sliding_window_log: limit %d is over %d entries per key; use sliding_window_counter", p.Rate, maxLogLimit)
	}
	return nil
}

// defaultBurst is the burst of a zone that sets none: N of the rate, but
// none for the leaky bucket (nginx's default: requests are spaced out).
func defaultBurst(algo limiter.Algorithm, n int64) int64 {
	if algo == limiter.LeakyBucket {
		return 0
	}
	return n
}

// checkAlgorithmOptions refuses options that the algorithm does not use.
func (z *Zone) checkAlgorithmOptions(algo limiter.Algorithm) error {
	switch {
	case algo.Windowed() && (z.Burst != "" || z.DefaultBurst != 0):
		return fmt.Errorf("burst does not apply to %s: its limit is N of the rate per window", algo)
	case z.NoDelay && algo != limiter.LeakyBucket:
		return fmt.Errorf("nodelay applies to leaky_bucket only")
	case z.Lease != 0:
		return fmt.Errorf("lease applies to max_concurrent only")
	}
	return nil
}

// defaultLease is Zone.Lease when unset.
const defaultLease = 5 * time.Minute

// checkConcurrency sets up a zone that limits requests in flight.
func (z *Zone) checkConcurrency() error {
	if z.Rate != "" || z.Algorithm != "" || z.Burst != "" || z.Cost != "" || z.NoDelay || z.Ban != nil {
		return fmt.Errorf("max_concurrent limits requests in flight: rate, algorithm, burst, cost, nodelay and ban do not apply")
	}
	if z.MaxConcurrent < 0 {
		return fmt.Errorf("max_concurrent %d: want at least 1", z.MaxConcurrent)
	}
	z.static, z.cost = true, 1
	z.policy = limiter.Policy{Algorithm: limiter.Concurrency, Burst: z.MaxConcurrent,
		Lease: cmp.Or(time.Duration(z.Lease), defaultLease)}
	return z.policy.Validate()
}

// staticCount is a burst or cost: its literal value, or for a template its
// default, or else def.
func staticCount(field string, v caddyhttp.WeakString, dflt, def int64) (int64, error) {
	if dflt < 0 {
		return 0, fmt.Errorf("default_%s %d: want at least 1", field, dflt)
	}
	if v == "" || hasPlaceholder(string(v)) {
		return cmp.Or(dflt, def), nil
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s %q: want a whole number of at least 1", field, v)
	}
	return n, nil
}

// limits are the zone's policy and cost for one request: the static ones,
// or those its placeholders give, falling back to the defaults (with one
// warning per zone and field) when a value is not valid.
func (z *Zone) limits(repl *caddy.Replacer, logger *zap.Logger) (limiter.Policy, int64) {
	if z.static {
		return z.policy, z.cost
	}
	p, cost := z.policy, z.cost
	if hasPlaceholder(z.Rate) {
		if n, period, err := limiter.ParseRate(repl.ReplaceAll(z.Rate, "")); err == nil {
			p.Rate, p.Period = n, period
		} else {
			z.warn(0, logger, "rate", err)
		}
		if z.Burst == "" { // the default burst of the rate in force
			p.Burst = defaultBurst(p.Algorithm, p.Rate)
		}
	}
	if hasPlaceholder(string(z.Burst)) {
		p.Burst = z.dynamicCount(1, logger, "burst", z.Burst, repl, cmp.Or(z.DefaultBurst, defaultBurst(p.Algorithm, p.Rate)))
	}
	cost = z.dynamicCount(2, logger, "cost", z.Cost, repl, cost)
	if err := cmp.Or(p.Validate(), checkAlgorithmLimits(p)); err != nil {
		z.warn(3, logger, "rate and burst", err)
		p = z.policy
	}
	return p, cost
}

// dynamicCount resolves a burst or cost template, or keeps def.
func (z *Zone) dynamicCount(i int, logger *zap.Logger, field string, v caddyhttp.WeakString, repl *caddy.Replacer, def int64) int64 {
	if !hasPlaceholder(string(v)) {
		return def
	}
	s := repl.ReplaceAll(string(v), "")
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		z.warn(i, logger, field, fmt.Errorf("%q is not a whole number of at least 1", s))
		return def
	}
	return n
}

// warn logs, once per zone and field, that a template gave no valid value.
func (z *Zone) warn(i int, logger *zap.Logger, field string, err error) {
	if z.warned[i].CompareAndSwap(false, true) {
		logger.Warn("placeholder gave no valid value; using the zone's default (logged once)",
			zap.String("zone", z.name), zap.String("field", field), zap.Error(err))
	}
}

// Validate reports configuration errors that Provision did not.
func (h *Handler) Validate() error {
	if len(h.zones) == 0 {
		return fmt.Errorf("no zones: add at least one zone")
	}
	return nil
}

// Cleanup releases the store.
func (h *Handler) Cleanup() error {
	unregisterZones(h)
	if h.poolKey == "" {
		return nil
	}
	_, err := stores.Delete(h.poolKey)
	h.poolKey = ""
	return err
}

// ServeHTTP checks the zones that apply to r, answers 429 if one refuses,
// and otherwise passes r on with the limit headers set.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if h.verifier != nil {
		h.useClaims(r, repl)
	}
	reqs, zones, err := h.requests(r, repl)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	reqs, zones, dryRel, shown := h.dryRun(r.Context(), reqs, zones)
	defer dryRel.call()
	if shown != nil {
		h.setLimitHeaders(w.Header(), *shown)
	}
	if len(reqs) == 0 {
		return next.ServeHTTP(w, r)
	}
	if o, banned := h.banned(r.Context(), reqs, zones); banned {
		o.setPlaceholders(repl)
		h.setLimitHeaders(w.Header(), o)
		h.logRefusal(o)
		return h.refuse(w, o)
	}
	decisions, rel, failed, err := h.take(r.Context(), reqs)
	count(zones, decisions, failed, false)
	h.countRefusals(r.Context(), reqs, decisions)
	if err != nil { // Redis failed, on_store_error deny
		if h.onError.Mode == "deny" {
			w.Header().Set("Retry-After", strconv.FormatInt(int64(breakerCooldown/time.Second), 10))
		}
		return err
	}
	if decisions == nil { // Redis failed, on_store_error allow
		return next.ServeHTTP(w, r)
	}
	i := mostRestrictive(decisions)
	o := h.outcome(zones[i].name, reqs[i], decisions[i])
	o.setPlaceholders(repl)
	if shown == nil || !o.d.Allowed || o.d.Remaining <= shown.d.Remaining {
		h.setLimitHeaders(w.Header(), o)
	}
	if !o.d.Allowed {
		h.logRefusal(o)
		return h.refuse(w, o)
	}
	defer rel.call()
	if err := wait(r.Context(), maxDelay(decisions)); err != nil {
		return caddyhttp.Error(499, fmt.Errorf("client left while its request waited its turn: %w", err))
	}
	return next.ServeHTTP(w, r)
}

// banStore is the store that keeps bans: Redis while it answers (bans are
// shared by the fleet), else this instance's memory.
func (h *Handler) banStore() limiter.Store {
	if b := h.backend; b.redis != nil && !b.breaker.Open() {
		return b.redis
	}
	return h.backend.local
}

// banned looks up the bans of the zones that ban (skipping clients the
// local cache already refuses) and returns the outcome of the longest.
func (h *Handler) banned(ctx context.Context, reqs []limiter.Request, zones []*Zone) (outcome, bool) {
	var look []limiter.Request
	var at []int
	now := h.now()
	for i, r := range reqs {
		if r.Policy.Ban.After == 0 {
			continue
		}
		if c := h.backend.cache; c != nil {
			if _, hit := c.Get(r, now); hit {
				continue // decided from the cache by take, without Redis
			}
		}
		look, at = append(look, r), append(at, i)
	}
	if len(look) == 0 {
		return outcome{}, false
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(h.timeout, time.Second))
	left, err := h.banStore().Banned(tctx, look)
	cancel()
	if err != nil {
		h.logger.Debug("looking up bans", zap.Error(err))
		return outcome{}, false
	}
	best := -1
	for j, l := range left {
		if l > 0 && (best < 0 || l > left[best]) {
			best = j
		}
	}
	if best < 0 {
		return outcome{}, false
	}
	i := at[best]
	d := h.banDecision(reqs[i], left[best], now)
	metrics.decisions.WithLabelValues(zones[i].name, resultBanned).Inc()
	return h.outcome(zones[i].name, reqs[i], d), true
}

// banDecision is the refusal of a banned client, remembered by the local
// cache so that its next requests are refused without Redis.
func (h *Handler) banDecision(r limiter.Request, left time.Duration, now time.Time) limiter.Decision {
	d := limiter.Decision{Limit: r.Policy.Limit(), Reset: now.Add(left), RetryAfter: left, Banned: true}
	if c := h.backend.cache; c != nil {
		c.PutBan(r, d, now)
	}
	return d
}

// countRefusals counts, for the zones that ban, the refusals among
// decisions, and turns a refusal that starts (or meets) a ban into the
// ban's refusal.
func (h *Handler) countRefusals(ctx context.Context, reqs []limiter.Request, decisions []limiter.Decision) {
	for i, d := range decisions {
		r := reqs[i]
		if d.Allowed || d.Limit == 0 || d.Banned || r.Policy.Ban.After == 0 {
			continue // a ban's refusal counts no more
		}
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(h.timeout, time.Second))
		left, started, err := h.banStore().Refused(tctx, r)
		cancel()
		if err != nil {
			h.logger.Debug("counting a refusal for bans", zap.Error(err))
			continue
		}
		if started {
			metrics.bans.WithLabelValues(r.Zone).Inc()
			h.logger.Info("client banned", zap.String("zone", r.Zone), zap.Duration("for", left))
		}
		if left > d.RetryAfter {
			decisions[i] = h.banDecision(r, left, h.now())
		}
	}
}

// dryRun decides the dry-run zones of a request on their own, counting
// and logging what they would have done, and returns the other zones and
// the release of the dry-run concurrency slots (held like real ones, so
// that a dry-run max_concurrent sees the requests in flight).
func (h *Handler) dryRun(ctx context.Context, reqs []limiter.Request, zones []*Zone) ([]limiter.Request, []*Zone, release, *outcome) {
	var dry []limiter.Request
	var dryZones []*Zone
	n := 0
	for i, z := range zones {
		if h.DryRun || z.DryRun {
			dry, dryZones = append(dry, reqs[i]), append(dryZones, z)
			continue
		}
		reqs[n], zones[n] = reqs[i], z
		n++
	}
	if len(dry) == 0 {
		return reqs, zones, nil, nil
	}
	decisions, rel, failed, _ := h.take(ctx, dry)
	count(dryZones, decisions, failed, true)
	for i, d := range decisions {
		if !d.Allowed {
			h.logger.Debug("dry run: would be rate limited", zap.String("zone", dryZones[i].name),
				zap.Int64("retry_after", d.RetryAfterSeconds()))
		}
	}
	return reqs[:n], zones[:n], rel, h.dryRunOutcome(dry, dryZones, decisions)
}

// dryRunOutcome is what the dry-run zones would show in the headers, as an
// allowance, with DryRunHeaders; else nil.
func (h *Handler) dryRunOutcome(reqs []limiter.Request, zones []*Zone, decisions []limiter.Decision) *outcome {
	if !h.DryRunHeaders || len(decisions) == 0 {
		return nil
	}
	i := mostRestrictive(decisions)
	d := decisions[i]
	d.Allowed, d.RetryAfter = true, 0
	o := h.outcome(zones[i].name, reqs[i], d)
	return &o
}

// count adds the decisions to the metrics; failed means on_store_error
// decided them, dryRun that refusals were not enforced.
func count(zones []*Zone, decisions []limiter.Decision, failed, dryRun bool) {
	for i, z := range zones {
		result := resultStoreError
		switch {
		case failed:
		case decisions[i].Limit == 0: // not asked: another zone refused from the local cache
			continue
		case decisions[i].Banned:
			result = resultBanned
		case !decisions[i].Allowed && dryRun:
			result = resultDryRun
		case decisions[i].Allowed:
			result = resultAllowed
		default:
			result = resultDenied
		}
		metrics.decisions.WithLabelValues(z.name, result).Inc()
	}
}

// maxDelay is the longest wait a leaky bucket asks of the request.
func maxDelay(decisions []limiter.Decision) time.Duration {
	var d time.Duration
	for _, x := range decisions {
		d = max(d, x.Delay)
	}
	return d
}

// wait sleeps for d, or until the client goes away.
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release gives back, when called, the concurrency slots a store took
// for a request. Calling a nil release does nothing.
type release func()

func (r release) call() {
	if r != nil {
		r()
	}
}

// releaser returns the release of the concurrency slots that store took
// for reqs; nil when reqs hold none. Redis is skipped while the breaker is
// open: the leases expire by themselves.
func (h *Handler) releaser(store limiter.Store, reqs []limiter.Request) release {
	if !slices.ContainsFunc(reqs, func(r limiter.Request) bool { return r.Policy.Algorithm == limiter.Concurrency }) {
		return nil
	}
	return func() {
		if b := h.backend; store != limiter.Store(b.local) && b.breaker.Open() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(h.timeout, time.Second))
		defer cancel()
		if err := store.Release(ctx, reqs); err != nil {
			h.logger.Debug("concurrency slots not released; their leases will expire", zap.Error(err))
		}
	}
}

// take decides reqs with Redis when configured, else in memory. When Redis
// fails it applies on_store_error: decisions from the local store, none
// (allow), or an error (deny). release, when not nil, gives back the
// concurrency slots taken.
func (h *Handler) take(ctx context.Context, reqs []limiter.Request) (d []limiter.Decision, rel release, failed bool, err error) {
	b := h.backend
	if b.redis == nil {
		start := time.Now()
		d = b.local.TakeAt(h.now(), reqs)
		metrics.storeLatency.WithLabelValues("memory").Observe(time.Since(start).Seconds())
		return d, h.releaser(b.local, reqs), false, nil
	}
	d, err = h.takeRedis(ctx, reqs)
	if err != nil {
		d, rel, err = h.storeFailed(reqs, err)
		return d, rel, true, err
	}
	return d, h.releaser(b.redis, reqs), false, nil
}

// takeRedis asks Redis, within the timeout and unless the breaker is open.
// A client that leaves does not cut the call short: every call that starts
// ends as a success or a failure of the breaker (a probe included), and a
// script that ran is not retried.
func (h *Handler) takeRedis(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	b, now := h.backend, h.now()
	if d, hit := h.cached(reqs, now); hit {
		return d, nil
	}
	if !b.breaker.Allow(now) {
		metrics.storeErrors.WithLabelValues("redis").Inc()
		return nil, errBreakerOpen
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.timeout)
	start := time.Now()
	decisions, err := b.redis.Take(tctx, reqs)
	metrics.storeLatency.WithLabelValues("redis").Observe(time.Since(start).Seconds())
	cancel()
	var refund *limiter.RefundError
	if errors.As(err, &refund) { // the request is refused either way
		h.logger.Debug("refund of a refused request failed; its tokens stay taken", zap.Error(err))
		go h.releaser(b.redis, reqs).call() // its concurrency slots, at least
		err = nil
	}
	if err != nil {
		metrics.storeErrors.WithLabelValues("redis").Inc()
		// A script may have run before the error: give back any slot.
		go h.releaser(b.redis, reqs).call()
		if b.breaker.Failure(now) {
			metrics.breakerOpen.Set(1)
			h.logger.Warn("redis circuit breaker open: skipping redis", zap.Duration("cooldown", breakerCooldown))
		}
		return nil, err
	}
	if b.breaker.Success() {
		metrics.breakerOpen.Set(0)
	}
	for i, d := range decisions {
		b.cache.Put(reqs[i], d, now)
	}
	if b.failing.Load() && b.failing.CompareAndSwap(true, false) {
		h.logger.Info("redis store available again; decisions are shared again")
	}
	return decisions, nil
}

// cached answers a request that a zone refused lately from the local
// cache, without Redis: the refusing zone's decision, and zero decisions
// (not asked) for the others.
func (h *Handler) cached(reqs []limiter.Request, now time.Time) ([]limiter.Decision, bool) {
	for i, r := range reqs {
		d, hit := h.backend.cache.Get(r, now)
		if !hit {
			continue
		}
		metrics.cacheHits.WithLabelValues(r.Zone).Inc()
		decisions := make([]limiter.Decision, len(reqs))
		decisions[i] = d
		return decisions, true
	}
	return nil, false
}

var errBreakerOpen = errors.New("circuit breaker open after consecutive redis failures")

// storeFailed applies on_store_error to a request that Redis did not decide.
func (h *Handler) storeFailed(reqs []limiter.Request, err error) ([]limiter.Decision, release, error) {
	if h.backend.failing.CompareAndSwap(false, true) {
		h.logger.Error("redis store failing; on_store_error applies until it answers again",
			zap.String("on_store_error", h.onError.Mode), zap.Error(err))
	} else {
		h.logger.Debug("redis store failed", zap.Error(err))
	}
	switch h.onError.Mode {
	case "allow":
		return nil, nil, nil
	case "deny":
		return nil, nil, caddyhttp.Error(h.onError.Status, fmt.Errorf("rate limit store: %w", err))
	}
	local := make([]limiter.Request, len(reqs))
	for i, r := range reqs {
		if p, err := localPolicy(r.Policy, h.onError.Instances); err == nil {
			r.Policy = p
		}
		local[i] = r
	}
	return h.backend.local.TakeAt(h.now(), local), h.releaser(h.backend.local, local), nil
}

// jwtPlaceholder starts the placeholders of verified claims.
const jwtPlaceholder = "http.rate_limit.jwt."

// jwtState holds a request's claims. One provider per request answers the
// {http.rate_limit.jwt.*} placeholders, with the verifier of the rate_limit
// handler running now (handlers in one route may trust different keys), and
// verifies the token at most once per handler, when a claim is first asked
// for. A claim the token does not carry, or a token not accepted, is empty.
type jwtState struct {
	mu      sync.Mutex
	r       *http.Request
	current *Handler
	claims  map[*Handler]map[string]any
}

// jwtStateVar names the request's jwtState among Caddy's request vars.
const jwtStateVar = "rate_limit_jwt_state"

// useClaims makes h the verifier of r's claim placeholders.
func (h *Handler) useClaims(r *http.Request, repl *caddy.Replacer) {
	st, _ := caddyhttp.GetVar(r.Context(), jwtStateVar).(*jwtState)
	if st == nil {
		st = &jwtState{r: r, claims: make(map[*Handler]map[string]any, 1)}
		repl.Map(st.placeholder)
		caddyhttp.SetVar(r.Context(), jwtStateVar, st)
	}
	st.mu.Lock()
	st.current = h
	st.mu.Unlock()
}

func (st *jwtState) placeholder(key string) (any, bool) {
	path, ok := strings.CutPrefix(key, jwtPlaceholder)
	if !ok {
		return nil, false
	}
	st.mu.Lock()
	claims, done := st.claims[st.current]
	if !done {
		claims = st.current.verify(st.r)
		st.claims[st.current] = claims
	}
	st.mu.Unlock()
	v, _ := clientkey.ClaimString(claims, path)
	return v, true
}

// verify returns the claims of r's token, or nil.
func (h *Handler) verify(r *http.Request) map[string]any {
	token := h.JWT.token(r)
	if token == "" {
		return nil
	}
	claims, err := h.verifier.Verify(token, h.now())
	if err != nil {
		h.logger.Debug("jwt not accepted: no claims", zap.Error(err))
		return nil
	}
	return claims
}

// token is the raw token r carries, or "".
func (c *JWTConfig) token(r *http.Request) string {
	if c.FromCookie != "" {
		ck, err := r.Cookie(c.FromCookie)
		if err != nil {
			return ""
		}
		return ck.Value
	}
	v := strings.TrimSpace(r.Header.Get(cmp.Or(c.FromHeader, "Authorization")))
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		v = strings.TrimSpace(v[7:])
	}
	return v
}

// verifier loads the keys of c; skipped lists the keys of the JWKS file
// that it cannot use.
func (c *JWTConfig) verifier() (v *clientkey.Verifier, skipped []string, err error) {
	if c.FromHeader != "" && c.FromCookie != "" {
		return nil, nil, fmt.Errorf("from: a header or a cookie, not both")
	}
	leeway := defaultLeeway
	if c.Leeway != nil {
		leeway = time.Duration(*c.Leeway)
	}
	if leeway < 0 {
		return nil, nil, fmt.Errorf("leeway %s: must not be negative", leeway)
	}
	keys, skipped, err := c.keys()
	if err != nil {
		return nil, nil, err
	}
	v, err = clientkey.NewVerifier(keys, clientkey.VerifierOptions{Issuer: c.Issuer, Audience: c.Audience, Leeway: leeway})
	return v, skipped, err
}

// keys reads the secret and the key files of c.
func (c *JWTConfig) keys() (keys clientkey.Keys, skipped []string, err error) {
	// An unknown placeholder is an error: left as text, it would be a
	// secret anyone can read in the config.
	secret, err := caddy.NewReplacer().ReplaceOrErr(c.Secret, true, true)
	if err != nil {
		return keys, nil, fmt.Errorf("secret: %w", err)
	}
	keys.Secret = []byte(secret)
	if c.PublicKeyFile != "" {
		public, err := clientkey.LoadPublicKeyFile(c.PublicKeyFile)
		if err != nil {
			return keys, nil, err
		}
		keys.Public = public
	}
	if c.JWKSFile != "" {
		public, skip, err := clientkey.LoadJWKSFile(c.JWKSFile)
		if err != nil {
			return keys, nil, err
		}
		keys.Public, skipped = append(keys.Public, public...), skip
	}
	return keys, skipped, nil
}

// defaultLeeway is JWTConfig.Leeway when unset.
const defaultLeeway = 30 * time.Second

// requests builds one store request per zone that applies to r.
func (h *Handler) requests(r *http.Request, repl *caddy.Replacer) ([]limiter.Request, []*Zone, error) {
	var reqs []limiter.Request
	var zones []*Zone
	var id string
	for _, z := range h.zones {
		match, err := z.matchers.AnyMatchWithError(r)
		if err != nil {
			return nil, nil, fmt.Errorf("zone %q: matching: %w", z.name, err)
		}
		if !match {
			continue
		}
		key := repl.ReplaceAll(z.Key, "")
		if key == "" && z.OnEmptyKey == "skip" {
			continue
		}
		key = clientkey.Subnet(key, cmp.Or(z.IPv4Prefix, 32), cmp.Or(z.IPv6Prefix, 64))
		policy, cost := z.limits(repl, h.logger)
		req := limiter.Request{Zone: z.name, Key: key, Policy: policy, Cost: cost}.WithDigest()
		if a := policy.Algorithm; a == limiter.Concurrency || a == limiter.SlidingWindowLog {
			if id == "" {
				id = rand.Text() // names this request's slot or log entries
			}
			req.ID = id
		}
		reqs = append(reqs, req)
		zones = append(zones, z)
	}
	return reqs, zones, nil
}

// mostRestrictive is the index of the decision the client is shown.
func mostRestrictive(decisions []limiter.Decision) int {
	best := 0
	for i, d := range decisions[1:] {
		if d.MoreRestrictive(decisions[best]) {
			best = i + 1
		}
	}
	return best
}

// stores holds the backends shared by every handler and kept across config
// reloads, so that counters survive a reload and Redis connections are
// reused: one per distinct Redis configuration.
var stores = caddy.NewUsagePool()

// memoryPoolKey names the in-memory backend in stores.
const memoryPoolKey = "memory"

// Circuit breaker: after breakerFailures consecutive Redis failures, Redis
// is skipped for breakerCooldown, then probed.
const (
	breakerFailures = 3
	breakerCooldown = 2 * time.Second
)

// backend is what handlers decide with: the memory store alone, or Redis
// with its circuit breaker and the memory store for on_store_error local.
type backend struct {
	redis   *limiter.RedisStore
	local   *limiter.MemoryStore
	breaker *limiter.Breaker
	cache   *limiter.DenyCache // clients Redis refused, refused here until they could pass
	failing atomic.Bool        // Redis failed last time: on_store_error applies
}

func newMemoryBackend() (caddy.Destructor, error) {
	return &backend{local: limiter.NewMemoryStore(0)}, nil
}

// Destruct closes the stores, when the last handler using them is cleaned up.
func (b *backend) Destruct() error {
	if b.breaker != nil && b.breaker.Open() {
		metrics.breakerOpen.Set(0) // this Redis is no longer used
	}
	err := b.local.Close()
	if b.redis != nil {
		err = errors.Join(err, b.redis.Close())
	}
	return err
}

// loadBackend acquires the backend under key; Cleanup releases it.
func (h *Handler) loadBackend(key string, construct caddy.Constructor) error {
	v, _, err := stores.LoadOrNew(key, construct)
	if err != nil {
		return fmt.Errorf("loading store: %w", err)
	}
	h.backend, h.poolKey = v.(*backend), key
	return nil
}

// RedisConfig says how to reach Redis. Addresses, username, password and
// master name may use placeholders such as {env.REDIS_PASSWORD}.
type RedisConfig struct {
	// Addresses are host:port of Redis. One address: a standalone server
	// (or a cluster, with Cluster set); several: Redis Cluster nodes; with
	// MasterName: Sentinel servers. Required.
	Addresses []string `json:"addresses,omitempty"`

	// Cluster treats a single address as a seed of Redis Cluster (several
	// addresses always mean a cluster).
	Cluster bool `json:"cluster,omitempty"`

	// MasterName is the name of the master monitored by Sentinel; with it,
	// Addresses are the Sentinels.
	MasterName string `json:"master_name,omitempty"`

	// Username and Password authenticate to Redis (ACL or requirepass).
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`

	// DB is the database number (standalone and Sentinel only). Default: 0.
	DB int `json:"db,omitempty"`

	// TLS, when set, connects with TLS.
	TLS *RedisTLS `json:"tls,omitempty"`

	// KeyPrefix starts every Redis key of the limiter; it must not contain
	// { or }. Default: "rl:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// PoolSize is the largest number of connections per Redis node.
	// Default: 10 per CPU (go-redis's default).
	PoolSize int `json:"pool_size,omitempty"`

	// Timeout is the longest a decision waits on Redis (connection, command
	// and reply); after it, on_store_error applies. Default: 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// LocalCache is how many clients refused by Redis this instance
	// remembers, to refuse their next requests without asking Redis until
	// they could pass (at most 5s, so that a reset through the admin API
	// of another instance reaches this one soon): a client hammering past
	// its limit costs no Redis calls. 0 means the default, 10000; -1 turns
	// it off.
	LocalCache int `json:"local_cache,omitempty"`
}

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	// CA is a PEM file of the certificate authorities that sign the
	// servers' certificates. Default: the system's roots.
	CA string `json:"ca,omitempty"`
	// Cert and Key are PEM files of a client certificate and its key, for
	// servers that require one.
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// ServerName is the name expected in the servers' certificates.
	// Default: the host of each address.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// localCacheSize is the size of the cache of refused clients.
func localCacheSize(n int) int {
	if n == 0 {
		return 10000
	}
	return max(n, 0)
}

// localCacheMaxAge bounds how long a refusal is answered locally.
const localCacheMaxAge = 5 * time.Second

// defaultRedisTimeout is RedisConfig.Timeout when unset.
const defaultRedisTimeout = 100 * time.Millisecond

// provisionRedis acquires the Redis backend of h.Redis, shared by every
// handler with the same configuration.
func (h *Handler) provisionRedis() error {
	cfg, err := h.Redis.resolve()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	h.timeout = time.Duration(cfg.Timeout)
	opts, err := cfg.options()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	key, err := cfg.poolKey()
	if err != nil {
		return err
	}
	created := false
	err = h.loadBackend(key, func() (caddy.Destructor, error) {
		store, err := limiter.NewRedisStore(redis.NewUniversalClient(opts), cfg.KeyPrefix)
		if err != nil {
			return nil, err
		}
		created = true
		return &backend{redis: store, local: limiter.NewMemoryStore(0),
			breaker: limiter.NewBreaker(breakerFailures, breakerCooldown),
			cache:   limiter.NewDenyCache(localCacheSize(cfg.LocalCache), localCacheMaxAge)}, nil
	})
	if err == nil && created {
		h.checkRedis()
	}
	return err
}

// checkRedis warns when Redis does not answer at start; Caddy starts
// anyway and on_store_error applies until Redis answers.
func (h *Handler) checkRedis() {
	ctx, cancel := context.WithTimeout(context.Background(), max(h.timeout, time.Second))
	defer cancel()
	if err := h.backend.redis.Ping(ctx); err != nil {
		h.logger.Warn("redis not reachable at start; on_store_error applies until it is",
			zap.Strings("addresses", h.Redis.Addresses), zap.String("on_store_error", h.onError.Mode), zap.Error(err))
	}
}

// resolve returns a copy of c with placeholders replaced, defaults set and
// values checked.
func (c *RedisConfig) resolve() (RedisConfig, error) {
	repl := caddy.NewReplacer()
	r := *c
	r.Addresses = make([]string, len(c.Addresses))
	for i, a := range c.Addresses {
		r.Addresses[i] = repl.ReplaceKnown(a, "")
	}
	r.MasterName = repl.ReplaceKnown(c.MasterName, "")
	r.Username = repl.ReplaceKnown(c.Username, "")
	r.Password = repl.ReplaceKnown(c.Password, "")
	r.KeyPrefix = cmp.Or(c.KeyPrefix, limiter.DefaultKeyPrefix)
	r.Timeout = cmp.Or(c.Timeout, caddy.Duration(defaultRedisTimeout))
	return r, r.check()
}

func (c *RedisConfig) check() error {
	switch {
	case len(c.Addresses) == 0 || slices.Contains(c.Addresses, ""):
		return fmt.Errorf("addresses: at least one host:port, none empty")
	case c.Timeout < 0:
		return fmt.Errorf("timeout %s: must be positive", time.Duration(c.Timeout))
	case strings.ContainsAny(c.KeyPrefix, "{}"):
		return fmt.Errorf("key_prefix %q: must not contain { or }", c.KeyPrefix)
	case c.PoolSize < 0:
		return fmt.Errorf("pool_size %d: must be positive", c.PoolSize)
	case c.LocalCache < -1:
		return fmt.Errorf("local_cache %d: want a size, 0 (the default) or -1 (off)", c.LocalCache)
	case c.DB < 0:
		return fmt.Errorf("db %d: must be 0 or more", c.DB)
	case c.DB != 0 && (c.Cluster || len(c.Addresses) > 1) && c.MasterName == "":
		return fmt.Errorf("db %d: Redis Cluster has only db 0", c.DB)
	}
	return nil
}

// options are the go-redis options of c: every wait bounded by Timeout.
func (c *RedisConfig) options() (*redis.UniversalOptions, error) {
	t := time.Duration(c.Timeout)
	opts := &redis.UniversalOptions{
		Addrs:                 c.Addresses,
		IsClusterMode:         c.Cluster,
		MasterName:            c.MasterName,
		Username:              c.Username,
		Password:              c.Password,
		DB:                    c.DB,
		PoolSize:              c.PoolSize,
		DialTimeout:           max(t, time.Second),
		ReadTimeout:           t,
		WriteTimeout:          t,
		PoolTimeout:           t,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1, // a script that may have run is not sent again
	}
	if c.TLS != nil {
		tlsConfig, err := c.TLS.config()
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		opts.TLSConfig = tlsConfig
	}
	return opts, nil
}

// config loads the certificates named by t.
func (t *RedisTLS) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("reading ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca %s: no PEM certificate found", t.CA)
		}
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, fmt.Errorf("cert and key go together")
	}
	if t.Cert != "" {
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("loading client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// poolKey names the backend of c in stores: handlers with the same
// resolved configuration share one Redis client. The password enters the
// key only as part of a digest.
func (c *RedisConfig) poolKey() (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return "redis:" + hex.EncodeToString(sum[:]), nil
}

// redisLogger routes go-redis's own log lines (failed dials and the like)
// to Caddy's logger at debug level: the handler logs failures once.
type redisLogger struct{}

func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	caddy.Log().Named("http.handlers.rate_limit.redis").Debug(fmt.Sprintf(format, v...))
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
