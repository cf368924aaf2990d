package ratelimit

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Zone is one limit. The requests it matches are counted per client key,
// each key in a bucket of its own, by the zone's algorithm: by default a
// token bucket that holds Burst tokens and refills at Rate, each request
// taking Cost tokens. With MaxConcurrent instead of a rate, the zone
// limits the requests of a key in flight at once.
//
// Rate, burst and cost may come from placeholders (a plan mapped from the
// request, a JWT claim), resolved per request; when they resolve to
// nothing valid, the zone's defaults apply and a warning is logged once.
type Zone struct {
	// Match limits the zone to the requests that match any of these
	// matcher sets, e.g. one path. Default: every request.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	// Key is the template of the client key, with placeholders such as
	// {client_ip} or {http.request.header.X-API-Key}; each distinct value
	// has its own bucket. Unknown placeholders resolve to nothing; a static
	// key makes one bucket shared by all. Default: none, one bucket for
	// the whole zone (as caddy-ratelimit's zones without a key).
	Key string `json:"key,omitempty"`

	// Rate is the sustained rate, "<N>r/<unit>" with unit s, m, h or d,
	// optionally with a multiplier: "100r/m", "5r/s", "30r/10m". Required,
	// unless MaxEvents and Window (or MaxConcurrent) set the limit.
	Rate string `json:"rate,omitempty"`

	// MaxEvents is caddy-ratelimit's spelling of a limit: with Window, at
	// most MaxEvents requests in any Window, counted exactly by a sliding
	// log (algorithm sliding_window_log, unless Algorithm names another;
	// the log holds up to 10000 per key). Instead of Rate. Default: none.
	MaxEvents int64 `json:"max_events,omitempty"`

	// Window is MaxEvents' window: any duration from 1ms to 100 years,
	// such as "60s", "1m30s" or "500ms". Required with MaxEvents.
	Window caddy.Duration `json:"window,omitempty"`

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
	// every address of a /24 shares one bucket; 0, as 32, means no
	// grouping. Default: 32 (each address alone).
	IPv4Prefix PrefixLength `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix groups keys that are IPv6 addresses by network, so that a
	// client cannot escape its limit by rotating addresses inside its own
	// subnet; 0 means no grouping (each address alone, as 128). Default:
	// 64 (one bucket per /64, the usual end-site subnet), also when the
	// field is absent; only an explicit 0 turns grouping off.
	IPv6Prefix PrefixLength `json:"ipv6_prefix,omitempty"`

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

	// Quota is a count per calendar period instead of a rate: at most
	// Quota requests (a number, or a placeholder with DefaultQuota) in
	// each QuotaPer of TimeZone's calendar, starting afresh at its start.
	Quota caddyhttp.WeakString `json:"quota,omitempty"`

	// QuotaPer is the quota's period: day, week, month or year, starting
	// at local midnight, Monday 00:00, the 1st and 1 January. Required
	// with Quota.
	QuotaPer string `json:"quota_per,omitempty"`

	// DefaultQuota is the quota when Quota's placeholders give no whole
	// number of at least 1. Required when Quota holds placeholders.
	DefaultQuota int64 `json:"default_quota,omitempty"`

	// TimeZone is the IANA time zone of the quota's calendar, such as
	// America/New_York. Default: UTC.
	TimeZone string `json:"time_zone,omitempty"`

	// MaxConcurrent limits the requests of a key in flight at once,
	// instead of a rate: a slot is taken when the request comes and given
	// back when its response ends (also when the client goes away).
	MaxConcurrent int64 `json:"max_concurrent,omitempty"`

	// Lease is, in Redis, how long a concurrency slot lives: a Caddy that
	// crashes with requests in flight holds their slots no longer. Longer
	// than any request should take. Default: 5m.
	Lease caddy.Duration `json:"lease,omitempty"`

	// Global makes the zone's limit one for the whole world: shared across
	// the handler's Regions, which it needs. Token bucket zones only
	// (without count_status or cost_from_response). Default: the limit
	// is the zone's Redis's (or this instance's).
	Global bool `json:"global,omitempty"`

	// DryRun computes, counts and logs the zone's decisions but never
	// refuses a request because of it, nor bans; it sets no headers but
	// with the handler's DryRunHeaders.
	DryRun bool `json:"dry_run,omitempty"`

	// Ban refuses repeat offenders for a while: a client refused After
	// times within Within is refused for For, whatever its bucket holds,
	// with a Retry-After of the ban's remaining time. With Redis, bans are
	// shared by the fleet. Default: no bans.
	Ban *BanConfig `json:"ban,omitempty"`

	// CountStatus charges only the requests whose response has one of
	// these statuses, e.g. [401, 403], or a class: 4 for any 4xx (as
	// Caddy's status matchers). Each request is still checked, and its
	// cost taken, before it goes on, so that parallel requests cannot
	// exceed the limit; the charge is given back when the response's
	// status is not one of these (a handler's error counts with its
	// status). Not with MaxConcurrent. Default: every request counts.
	CountStatus []int `json:"count_status,omitempty"`

	// CostFromResponse names a response header that says what the request
	// cost, e.g. X-Tokens-Used: the request is checked and charged Cost
	// before it goes on, and when its response's headers are written, the
	// difference to the header's amount (a whole number, at most
	// bucket.MaxCost) is charged, into debt if need be, or given back. A
	// bucket in debt refuses requests until the debt is repaid at the
	// rate. A missing or malformed value keeps Cost (logged once per
	// zone). token_bucket and leaky_bucket only. Default: none, a request
	// costs Cost.
	CostFromResponse string `json:"cost_from_response,omitempty"`

	// StripCostHeader removes CostFromResponse's header from the response
	// the client gets. Default: false, the header is passed on.
	StripCostHeader bool `json:"strip_cost_header,omitempty"`

	// OnEmptyKey is what happens when Key resolves to nothing (no such
	// header, no valid token): "shared" counts all such requests in one
	// bucket of the zone, so that leaving the header out cannot escape the
	// limit; "skip" leaves the request to the other zones. Default: shared.
	OnEmptyKey string `json:"on_empty_key,omitempty"`

	// Sync trades exactness for cost, with Redis: each instance decides
	// the zone's requests on its own, with no Redis call, and reconciles
	// each bucket with Redis at most every Sync (from 10ms to 1h). Over
	// any period the fleet admits at most what the exact limit admits in
	// that period and one Sync more (rate × Sync), plus (N−1)/N of the
	// burst and of rate × Sync, for N instances. Token bucket,
	// fixed_window and sliding_window_counter zones (a window's limit is
	// its burst), without ban, count_status or cost_from_response. A
	// handler's Distributed sets it for every zone that can sync.
	// Default: none, exact (every decision in Redis).
	Sync caddy.Duration `json:"sync,omitempty"`

	name        string
	distributed time.Duration // the sync a handler with distributed gives the zone, when it can sync and sets none
	viaStorage  bool          // it syncs through a storage (distributed without redis)
	matchers    caddyhttp.MatcherSets
	static      bool           // no placeholders in rate, burst and cost
	policy      limiter.Policy // the static policy, or the defaults
	cost        int64          // the static cost, or the default
	warned      [numDynamicFields]atomic.Bool
	// checkOverridden is takesOverridden, as a func value made once
	// (effectTarget).
	checkOverridden func(limiter.Policy) error
	// noMetrics leaves the zone's decisions out of the metrics
	// (the handler's disable_metrics).
	noMetrics bool
	// fixedKey: Key has no placeholder, and fixed is its bucket's request
	// (digest computed) with the static policy and cost.
	fixedKey bool
	fixed    limiter.Request
	// placeholder is the name of the one placeholder that Key is, if so:
	// its value is the key, without a template to replace.
	placeholder string
	// header and variable: the placeholder is a request header's (its
	// canonical name) or a request variable's (its name), read directly.
	header, variable string
	shown            zoneShown          // what its responses show, written once (response.go)
	hasher           *limiter.KeyHasher // digests its client keys (see RedisConfig.KeySecret)
	counters         decisionCounters   // its decision counters (metrics.go)
	// subdirectives are the zone block's, as the Caddyfile wrote them,
	// for the line its errors point at (caddyfile_zone.go).
	subdirectives []caddyfile.Token
	at            caddyfile.Token // its zone line in the Caddyfile
}

// Defaults of Zone's fields.
const (
	defaultIPv4Prefix = 32 // each IPv4 address alone
	defaultIPv6Prefix = 64 // one bucket per /64
	defaultLease      = 5 * time.Minute
)

// onEmptyKeyChoices are the values of Zone.OnEmptyKey.
const (
	onEmptyKeyShared = "shared"
	onEmptyKeySkip   = "skip"
)

var onEmptyKeyChoices = choices{onEmptyKeyShared, onEmptyKeySkip}

// maxLeakyWait bounds how long a leaky bucket may hold a request.
const maxLeakyWait = time.Minute

// maxLogLimit bounds a sliding log's limit: the log keeps one entry per
// request counted.
const maxLogLimit = 10000

// provisionZones compiles the zones, in the order of their names, after
// checking the regions their global limits need.
func (h *Handler) provisionZones(ctx caddy.Context) error {
	if err := h.checkRegions(); err != nil { // regions.go
		return err
	}
	hasher, err := h.Redis.keyHasher()
	if h.Redis == nil && h.Distributed != nil { // digests the instances that share the storage agree on
		hasher, err = sharedKeyHasher("distributed", h.Distributed.KeySecret)
	}
	if err != nil {
		return err
	}
	for _, name := range sortedNames(h.Zones) {
		z := h.Zones[name]
		if z != nil {
			z.hasher = hasher
		}
		if err := z.provision(ctx, name); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		if err := checkConstantKey(z.Key); err != nil && h.Redis == nil && h.Distributed == nil { // shared, one bucket per instance
			return fmt.Errorf("zone %q: %w", name, err)
		}
		if z.Sync != 0 && h.Redis == nil && h.Distributed == nil {
			return fmt.Errorf("zone %q: sync %s needs a redis block: without Redis, every zone is decided in this instance already", name, time.Duration(z.Sync))
		}
		if err := h.checkStorageZone(z); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		warnForgeableKey(h.logger, name, z.Key)
		warnLeftmostClientIP(ctx, h.logger, name, z.Key)
		if _, err := bucket.InstanceShare(z.policy, h.onError.Instances); err != nil {
			return fmt.Errorf("zone %q: on_store_error local instances %d: %w", name, h.onError.Instances, err)
		}
		h.zones = append(h.zones, z)
	}
	// The dry-run zones last: the store decides them apart, without copies
	// (limiter.Limiter.Decide).
	slices.SortStableFunc(h.zones, func(a, b *Zone) int { return cmp.Compare(btoi(h.DryRun || a.DryRun), btoi(h.DryRun || b.DryRun)) })
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func sortedNames(zones map[string]*Zone) []string {
	names := make([]string, 0, len(zones))
	for name := range zones {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// provision names z, checks it and loads its matchers.
func (z *Zone) provision(ctx caddy.Context, name string) error {
	if z == nil {
		return fmt.Errorf("empty zone")
	}
	z.name = name
	z.checkOverridden = z.takesOverridden
	for _, f := range [...][2]string{{"key", z.Key}, {"rate", z.Rate}, {"burst", string(z.Burst)}, {"cost", string(z.Cost)}} {
		if err := checkPlaceholders(f[0], f[1]); err != nil {
			return err
		}
	}
	if err := z.check(); err != nil {
		return err
	}
	z.compileKey()
	z.shown.init(name, z.policy)
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
// policy and cost. The Caddyfile parser calls it too, so that errors show
// the zone's line.
func (z *Zone) check() error {
	switch {
	case z.name == "":
		return fmt.Errorf("zone has no name")
	case strings.Trim(z.name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") != "":
		return fmt.Errorf("zone name %q: use letters, digits, '_', '-' and '.'", z.name)
	case z.Key == "" && z.OnEmptyKey == onEmptyKeySkip:
		return about(fmt.Errorf("on_empty_key skip needs a key: without one, the zone has a single bucket"), "on_empty_key")
	}
	err := cmp.Or(onEmptyKeyChoices.check("on_empty_key", z.OnEmptyKey),
		checkRange("ipv4_prefix", z.IPv4Prefix.bits(defaultIPv4Prefix, 32), 1, 32),
		checkRange("ipv6_prefix", z.IPv6Prefix.bits(defaultIPv6Prefix, 128), 1, 128),
		z.checkEvents(), z.checkGlobal())
	switch {
	case err != nil:
		return err
	case z.isQuota():
		return z.checkQuota() // zonequota.go
	case z.MaxConcurrent != 0 && z.settles():
		return about(fmt.Errorf("count_status and cost_from_response do not apply to max_concurrent: a slot is given back when the request ends, whatever its response"), "max_concurrent", "count_status", "cost_from_response")
	case z.MaxConcurrent != 0 && z.Sync != 0:
		return about(fmt.Errorf("sync does not apply to max_concurrent: concurrency limits stay exact"), "sync", "max_concurrent")
	case z.MaxConcurrent != 0:
		return z.checkConcurrency()
	case z.Rate == "" && z.MaxEvents == 0:
		return fmt.Errorf("rate (or max_concurrent) is required")
	}
	if err := z.compilePolicy(); err != nil {
		return err
	}
	if z.policy.Ban, err = z.Ban.policy(); err != nil {
		return err
	}
	return cmp.Or(z.checkSettle(), z.checkSync(), z.policy.Validate())
}

// compilePolicy computes the zone's static (or default) policy and cost
// from its rate, algorithm, burst and cost.
func (z *Zone) compilePolicy() error {
	algo, err := bucket.ParseAlgorithm(z.algorithm())
	if err != nil {
		return err
	}
	if err := z.checkAlgorithmOptions(algo); err != nil {
		return err
	}
	z.static = !hasPlaceholder(z.Rate) && !hasPlaceholder(string(z.Burst)) && !hasPlaceholder(string(z.Cost))
	n, period, err := z.staticRate()
	if err != nil {
		return err
	}
	z.policy = limiter.Policy{Algorithm: algo, Rate: n, Period: period, Burst: n, NoDelay: z.NoDelay}
	if z.policy.Burst, err = staticCount("burst", z.Burst, z.DefaultBurst, bucket.DefaultBurst(algo, n)); err != nil {
		return err
	}
	if z.cost, err = staticCount("cost", z.Cost, z.DefaultCost, 1); err != nil {
		return err
	}
	if z.cost > z.policy.Limit() && !hasPlaceholder(string(z.Burst)) && !hasPlaceholder(z.Rate) {
		return about(fmt.Errorf("cost %d is more than the limit, %d: every request would be refused", z.cost, z.policy.Limit()), "cost", "rate", "burst", "events")
	}
	return checkAlgorithmLimits(z.policy)
}

// staticRate is the zone's limit, N requests per period: MaxEvents per
// Window, or Rate (its default when Rate holds placeholders).
func (z *Zone) staticRate() (int64, time.Duration, error) {
	if z.MaxEvents != 0 {
		return z.MaxEvents, time.Duration(z.Window), nil
	}
	rate := z.Rate
	if hasPlaceholder(rate) {
		if z.DefaultRate == "" {
			return 0, 0, about(fmt.Errorf("rate %q has placeholders: default_rate is required", rate), "rate")
		}
		rate = z.DefaultRate
	}
	return parseRate(rate)
}

// checkAlgorithmLimits refuses policies that would hold requests or
// memory without bound.
func checkAlgorithmLimits(p limiter.Policy) error {
	switch {
	case p.Algorithm == limiter.LeakyBucket && !p.NoDelay && time.Duration(float64(p.Burst)*p.Interval()) > maxLeakyWait:
		return about(fmt.Errorf("leaky_bucket: burst %d at %s makes requests wait up to %s; at most %s (lower the burst, or use nodelay)",
			p.Burst, p, time.Duration(float64(p.Burst)*p.Interval()).Round(time.Second), maxLeakyWait), "burst", "rate", "algorithm", "nodelay")
	case p.Algorithm == limiter.SlidingWindowLog && p.Rate > maxLogLimit:
		return about(fmt.Errorf("sliding_window_log: limit %d is over %d entries per key; use sliding_window_counter", p.Rate, maxLogLimit), "rate", "algorithm")
	}
	return nil
}

// checkAlgorithmOptions refuses options that the algorithm does not use.
func (z *Zone) checkAlgorithmOptions(algo limiter.Algorithm) error {
	switch {
	case algo.Windowed() && (z.Burst != "" || z.DefaultBurst != 0):
		return about(fmt.Errorf("burst does not apply to %s: its limit is N of the rate per window", algo), "burst", "algorithm")
	case z.NoDelay && algo != limiter.LeakyBucket:
		return about(fmt.Errorf("nodelay applies to leaky_bucket only"), "nodelay", "algorithm")
	case z.Lease != 0:
		return about(fmt.Errorf("lease applies to max_concurrent only"), "lease")
	}
	return nil
}

// checkConcurrency sets up a zone that limits requests in flight.
func (z *Zone) checkConcurrency() error {
	if z.Rate != "" || z.MaxEvents != 0 || z.Window != 0 || z.Algorithm != "" || z.Burst != "" || z.Cost != "" || z.NoDelay || z.Ban != nil {
		return about(fmt.Errorf("max_concurrent limits requests in flight: rate, events, window, algorithm, burst, cost, nodelay and ban do not apply"), "max_concurrent", "rate", "events", "window", "algorithm", "burst", "cost", "nodelay", "ban")
	}
	if z.MaxConcurrent < 0 {
		return about(fmt.Errorf("max_concurrent %d: want at least 1", z.MaxConcurrent), "max_concurrent")
	}
	z.static, z.cost = true, 1
	z.policy = limiter.Policy{Algorithm: limiter.Concurrency, Slots: z.MaxConcurrent,
		Lease: cmp.Or(time.Duration(z.Lease), defaultLease)}
	return z.policy.Validate()
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

// policy is b as the limiter's ban; a nil b bans nobody.
func (b *BanConfig) policy() (limiter.Ban, error) {
	if b == nil {
		return limiter.Ban{}, nil
	}
	ban := limiter.Ban{After: b.After, Within: time.Duration(b.Within), For: time.Duration(b.For)}
	if b.After < 1 {
		return ban, about(fmt.Errorf("ban: after %d: want at least 1 refusal", b.After), "ban")
	}
	return ban, ban.Validate()
}
