// Package ratelimit is a Caddy HTTP handler, http.handlers.rate_limit, that
// limits the requests of each client, and a fleet of Caddy instances can
// share its limits through Redis. It is the Caddy module around package
// limiter, which decides: the root package knows Caddy and HTTP, and
// reaches every store through limiter.New and the Limiter's methods.
//
// A handler has zones. A zone matches some requests, names the client of
// each by a key template (an address, an API key, a JWT claim), and
// counts per key with an algorithm: a token bucket (the default), a fixed
// window, a sliding log, a sliding window counter, a leaky bucket, or a
// limit of requests in flight. ServeHTTP (this file) takes a request
// through three steps:
//
//   - identify (identify.go): every zone whose matchers match gives a
//     limiter.Request: the bucket of the client's key (zonekey.go) and the
//     policy and cost for this request, which may come from placeholders
//     (zone.go) or verified JWT claims (claims.go), under the run-time
//     overrides (overrides.go);
//   - decide: the store (a limiter.Limiter, shared across reloads:
//     store.go) gives one verdict, a state per zone, all or nothing;
//     metrics.go records it in the metrics and logs;
//   - respond (response.go): the most restrictive zone sets the headers
//     and placeholders, once; a refusal is answered 429 and reported
//     (refusallog.go, events.go), an allowed request goes on to the next
//     handler, and a zone that counts what the response says settles its
//     charge when the response's status is written (responsecount.go).
//
// The configuration: caddyfile.go, caddyfile_zone.go and caddyfile_args.go
// parse the rate_limit directive; each config type is provisioned in the
// file that carries it out (Zone in zone.go, RedisConfig in
// redisconfig.go, RegionsConfig in regions.go, StoreErrorPolicy in
// storeerror.go, JWTConfig in claims.go, with its key fetchers in
// jwtkeys.go); compat.go and distributed.go give caddy-ratelimit's
// spellings their meaning here; options.go lists the allowed values;
// placeholders.go checks a zone's placeholders. store.go keeps the
// limiters across reloads, storeevents.go reports what they tell, and
// metrics.go holds the metrics. admin.go serves the admin API.
package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/clientkey"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
	limiter.SetRedisLogger(func(msg string) { caddy.Log().Named("http.handlers.rate_limit.redis").Debug(msg) })
}

// Handler limits the rate of requests, per client, in zones. Every zone
// whose matchers match a request charges the client's bucket in it, all
// or nothing: a request that one zone refuses is answered 429 Too Many
// Requests, takes nothing from the other zones, and does not reach the
// next handler.
//
// Each zone counts with its algorithm (a token bucket by default; fixed or
// sliding windows, a leaky bucket, or a limit of requests in flight), in
// this process's memory or, with Redis, shared by every Caddy instance
// that uses the same Redis.
//
// Responses carry the limit headers of the most restrictive zone (by
// default X-RateLimit-Limit, -Remaining and -Reset; see Headers), and
// refusals Retry-After (seconds) and a body (see Response).
//
// The placeholders {http.rate_limit.zone}, {http.rate_limit.limit},
// {http.rate_limit.remaining}, {http.rate_limit.reset},
// {http.rate_limit.retry_after} and {http.rate_limit.exceeded} describe the
// decision to later handlers and logs; on a refusal,
// {http.rate_limit.exceeded.name} names the zone, and Caddy's events app
// gets a rate_limit_exceeded event (as with caddy-ratelimit, whose
// configuration this handler also accepts: see compat.go).
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

	// Regions makes the limits of the Global zones one across the regions
	// of a fleet, each region deciding from its own Redis (the redis
	// block, required with regions). Default: none, each zone's limit is
	// the one its store keeps.
	Regions *RegionsConfig `json:"regions,omitempty"`

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

	// DryRun computes, counts and logs the decisions of every zone but
	// never refuses a request: for rolling out new rules. Would-be
	// refusals are logged at info level, once per client and zone per
	// log_refusals' interval (default 1m). A zone can be in dry run on its
	// own.
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
	// A handler written in caddy-ratelimit's spelling (every zone with
	// events and window) defaults to "handle_errors", as caddy-ratelimit.
	Response string `json:"response,omitempty"`

	// Headers are the rate limit headers sent: "x_ratelimit" (the default:
	// X-RateLimit-Limit, -Remaining and -Reset), "ietf" (RateLimit-Policy
	// and RateLimit, as draft-ietf-httpapi-ratelimit-headers-10: ietf.go),
	// "both", or "none". RateLimit-Policy's q is the quota that
	// RateLimit's r counts down (the same number as X-RateLimit-Limit: the
	// burst of a token bucket, the rate of a window, the burst + 1 of a
	// leaky bucket), and w the seconds in which the whole quota comes back
	// (a window's period; for the buckets, the time to refill the quota at
	// the rate); a concurrency zone's has qu="concurrent-requests" and no
	// w. RateLimit's t is the seconds until more quota is available. With
	// "ietf" or "both", a refusal's body is the draft's quota-exceeded
	// problem type for a client that accepts application/problem+json
	// (the Response option's body for the others, with Vary: Accept).
	// Retry-After is always sent with a refusal.
	// A handler in caddy-ratelimit's spelling defaults to "none".
	Headers string `json:"headers,omitempty"`

	// RetryAfterJitter adds a random 0 to this much to Retry-After, so
	// that refused clients do not all come back at once. Default: 0.
	RetryAfterJitter caddy.Duration `json:"retry_after_jitter,omitempty"`

	// LogKeys adds the client key to the debug log of refused requests.
	// Keys may be personal data (addresses, user ids) or secrets (API
	// keys), so they are left out by default.
	LogKeys bool `json:"log_keys,omitempty"`

	// LogRefusals logs refused requests at info level, for fail2ban,
	// CrowdSec and the like: "rate limit exceeded" with the zone, the
	// client's address, the host and the path (the key only with
	// LogKeys), at most one line per client address and zone per
	// interval. Default: refusals are logged at debug level only; a
	// handler in caddy-ratelimit's spelling (every zone with events and
	// window) logs caddy-ratelimit's info line (zone, wait, remote_ip, and
	// key with LogKeys), at most once a second per client and zone. With
	// off, no info line at all.
	LogRefusals *RefusalLog `json:"log_refusals,omitempty"`

	// MemoryCapacity is how many buckets this process's memory store keeps,
	// across zones: the store without Redis; with Redis, on_store_error
	// local's. Default: 500000, at most about 120 MB of heap for token
	// buckets (234 B each), 125 MB for sliding logs of one request (250 B,
	// and 8 B more per request logged). At least 64. When it is
	// full, a new bucket evicts one that holds nothing back (full again),
	// else one close to full again (the soonest full of a few); the
	// evictions are counted in caddy_rate_limit_memory_evictions_total and
	// logged at warning level at most once a minute. Handlers that share a
	// store (all of them without Redis) share one capacity: the largest
	// that one of them sets, or else the default.
	MemoryCapacity int `json:"memory_capacity,omitempty"`

	// OverridesPoll is how often this instance reads the version of the
	// run-time overrides in Redis (set through the admin API, at
	// /rate_limit/overrides), besides the change messages Redis pushes
	// to it: a message missed heals within this interval. Handlers that
	// share a Redis share the shortest they set. No effect with the memory
	// store, whose overrides are this instance's alone. Default: 10s.
	OverridesPoll caddy.Duration `json:"overrides_poll,omitempty"`

	// RateLimits are zones under caddy-ratelimit's JSON name, with its
	// fields (key, window, max_events, ipv4_prefix, ipv6_prefix, match);
	// they join Zones, and a name in both is an error.
	RateLimits map[string]*Zone `json:"rate_limits,omitempty"`

	// LogKey is caddy-ratelimit's name of LogKeys.
	LogKey bool `json:"log_key,omitempty"`

	// Jitter adds up to this fraction of the wait to Retry-After, at
	// random, as caddy-ratelimit's jitter: 0.2 adds 0 to 20%. From 0 to 1;
	// RetryAfterJitter adds its seconds after it. Default: 0.
	Jitter float64 `json:"jitter,omitempty"`

	// DisableMetrics leaves this handler's zones out of the decision
	// metrics, and does not register the collectors in Caddy's registry
	// (another handler that does exports the store metrics all the same).
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// SweepInterval is accepted for caddy-ratelimit's configs and has no
	// effect: here the memory store drops idle buckets every 30s on its
	// own, and Redis expires them with their TTL.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	// Distributed (caddy-ratelimit's) has every zone sync: through the
	// redis block when there is one, else through Storage (see
	// Distributed). Default: none; the zones sync only with their own
	// sync.
	Distributed *Distributed `json:"distributed,omitempty"`
	// Storage is the storage module through which Distributed shares the
	// zones without a redis block, as in Caddy's storage option (such as
	// {"module": "file_system", "root": "/var/lib/caddy"}). Default:
	// Caddy's storage.
	Storage json.RawMessage `json:"storage,omitempty" caddy:"namespace=caddy.storage inline_key=module"`

	events       *caddyevents.App     // Caddy's events app, for rate_limit_exceeded; nil in tests without one
	eventCtx     caddy.Context        // the context events are emitted in: this handler's
	refusals     *refusalThrottle     // LogRefusals' memory of clients logged; nil without LogRefusals
	compatLog    bool                 // LogRefusals' lines are caddy-ratelimit's (its spelling, no log_refusals)
	storage      certmagic.Storage    // where Distributed shares the zones without Redis; nil with Redis
	storageLabel string               // storage's name in logs and metrics
	storageKey   string               // Distributed.KeySecret resolved: signs the storage's files; "": none
	claimConfig  *prometheus.Registry // the config whose zone names h claimed (zonenames.go)
	// dryRefusals is the memory of the dry-run refusals logged; nil
	// without dry-run zones.
	dryRefusals *refusalThrottle
	zones       []*Zone             // Zones, sorted by name, the dry-run ones last
	verifier    *clientkey.Verifier // JWT's keys; nil without JWT
	jwksKey     string              // JWT's key fetcher in jwksFetchers; "" without one, or once released
	store       *sharedLimiter      // what decides, shared through stores
	poolKey     string              // store's key in stores; "" once released
	onError     StoreErrorPolicy    // OnStoreError with its defaults
	caller      limiter.Caller      // onError and the events of decisions, for the store
	now         func() time.Time    // the clock; time.Now unless a test sets it
	// denyLogged is when on_store_error deny's refusals were last logged
	// (Unix ns).
	denyLogged *atomic.Int64
	wallNow    bool // now is time.Now: the memory store's time is its latency's start
	logger     *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision checks the configuration, compiles the zones and acquires the
// stores; each part provisions itself.
func (h *Handler) Provision(ctx caddy.Context) error {
	if h.logger == nil { // a test may have set one
		h.logger = ctx.Logger()
	}
	if h.now == nil {
		h.now, h.wallNow = time.Now, true
	}
	var err error
	if h.onError, err = h.OnStoreError.resolve(h.Redis != nil); err != nil {
		return err
	}
	h.denyLogged = new(atomic.Int64)
	h.caller = limiter.Caller{Fallback: h.onError.fallback(), Events: decisionEvents{logger: h.logger, mode: h.onError.Mode}}
	if err = h.checkResponseOptions(); err != nil {
		return err
	}
	if err = h.provisionCompat(); err != nil {
		return err
	}
	if err = h.provisionDistributed(ctx); err != nil {
		return err
	}
	if err = h.provisionRefusals(ctx); err != nil {
		return err
	}
	if err = registerMetrics(h.metricsRegistry(ctx)); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	if err = h.provisionJWT(); err != nil {
		return err
	}
	if err = h.provisionZones(ctx); err != nil {
		return err
	}
	if err = h.provisionStore(); err != nil {
		return err
	}
	h.provisionOverrides()
	h.logSyncBounds()
	h.logRegionBounds()
	if err = h.claimZoneNames(ctx.GetMetricsRegistry()); err != nil { // zonenames.go
		return err
	}
	registerZones(h)
	return nil
}

// Validate reports configuration errors that Provision did not.
func (h *Handler) Validate() error {
	if len(h.zones) == 0 {
		return fmt.Errorf("no zones: add at least one zone")
	}
	return nil
}

// Cleanup releases the stores and JWT's key fetcher, and removes the
// zones from the admin API.
func (h *Handler) Cleanup() error {
	unregisterZones(h)
	h.releaseZoneNames()
	h.releaseJWKS()
	return h.releaseStore()
}

// ServeHTTP identifies the client in each zone that applies to r, decides
// with the store, and responds: 429 if a zone refuses, else r goes on to
// next with the limit headers set.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	s := scratches.Get().(*scratch)
	defer h.recycle(s)
	reqs, zones, err := h.identify(r, repl, s)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	if len(reqs) == 0 {
		return next.ServeHTTP(w, r)
	}
	v := &s.verdict
	h.decide(r.Context(), reqs, zones, v)
	defer v.Release()
	return h.respond(w, r, next, repl, zones, v)
}

// decide asks the store for the verdict on reqs, the requests of zones,
// and records it in the metrics and logs.
func (h *Handler) decide(ctx context.Context, reqs []limiter.Request, zones []*Zone, v *limiter.Verdict) {
	var now time.Time // the store reads the wall clock once
	if !h.wallNow {
		now = h.now()
	}
	h.store.Decide(ctx, now, reqs, h.caller, v)
	h.record(zones, v)
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
