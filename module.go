// Package ratelimit is a Caddy HTTP handler that limits the rate of
// requests per client: token buckets keyed by Caddy placeholders, kept in
// memory or shared by a fleet of Caddy instances.
package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
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

	zones   []*Zone
	store   limiter.Store
	poolKey string
	logger  *zap.Logger
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

	// Burst is the capacity of the bucket: how many requests may come at
	// once after a quiet period. Default: N of the rate.
	Burst int64 `json:"burst,omitempty"`

	name     string
	matchers caddyhttp.MatcherSets
	policy   limiter.Policy
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
	for _, name := range sortedNames(h.Zones) {
		z := h.Zones[name]
		if err := z.provision(ctx, name); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		h.zones = append(h.zones, z)
	}
	store, key, err := loadMemoryStore()
	if err != nil {
		return fmt.Errorf("loading store: %w", err)
	}
	h.store, h.poolKey = store, key
	return nil
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
	policy, err := z.parsePolicy()
	if err != nil {
		return err
	}
	z.policy = policy
	if z.MatcherSetsRaw == nil {
		return nil
	}
	mods, err := ctx.LoadModule(z, "MatcherSetsRaw")
	if err != nil {
		return fmt.Errorf("loading matchers: %w", err)
	}
	return z.matchers.FromInterface(mods)
}

// parsePolicy checks the zone's fields and turns them into a policy.
func (z *Zone) parsePolicy() (limiter.Policy, error) {
	if z.name == "" {
		return limiter.Policy{}, fmt.Errorf("zone has no name")
	}
	if z.Key == "" {
		return limiter.Policy{}, fmt.Errorf("key is required")
	}
	if z.Rate == "" {
		return limiter.Policy{}, fmt.Errorf("rate is required")
	}
	n, period, err := limiter.ParseRate(z.Rate)
	if err != nil {
		return limiter.Policy{}, err
	}
	p := limiter.Policy{Rate: n, Period: period, Burst: z.Burst}
	if z.Burst == 0 {
		p.Burst = n
	}
	return p, p.Validate()
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
	reqs, zones, err := h.requests(r, repl)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	if len(reqs) == 0 {
		return next.ServeHTTP(w, r)
	}
	decisions, err := h.store.Take(r.Context(), reqs)
	if err != nil {
		return caddyhttp.Error(http.StatusServiceUnavailable, fmt.Errorf("rate limit store: %w", err))
	}
	i := mostRestrictive(decisions)
	z, d := zones[i], decisions[i]
	setPlaceholders(repl, z.name, d)
	setLimitHeaders(w.Header(), d)
	if !d.Allowed {
		h.logger.Debug("rate limited", zap.String("zone", z.name), zap.Int64("retry_after", d.RetryAfterSeconds()))
		return refuse(w, z, d)
	}
	return next.ServeHTTP(w, r)
}

// requests builds one store request per zone that applies to r.
func (h *Handler) requests(r *http.Request, repl *caddy.Replacer) ([]limiter.Request, []*Zone, error) {
	var reqs []limiter.Request
	var zones []*Zone
	for _, z := range h.zones {
		match, err := z.matchers.AnyMatchWithError(r)
		if err != nil {
			return nil, nil, fmt.Errorf("zone %q: matching: %w", z.name, err)
		}
		if !match {
			continue
		}
		key := repl.ReplaceAll(z.Key, "")
		reqs = append(reqs, limiter.Request{Zone: z.name, Key: key, Policy: z.policy, Cost: 1})
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

func setPlaceholders(repl *caddy.Replacer, zone string, d limiter.Decision) {
	repl.Set("http.rate_limit.zone", zone)
	repl.Set("http.rate_limit.limit", d.Limit)
	repl.Set("http.rate_limit.remaining", d.Remaining)
	repl.Set("http.rate_limit.reset", d.ResetUnix())
	repl.Set("http.rate_limit.exceeded", !d.Allowed)
	retry := int64(0)
	if !d.Allowed {
		retry = d.RetryAfterSeconds()
	}
	repl.Set("http.rate_limit.retry_after", retry)
}

func setLimitHeaders(hdr http.Header, d limiter.Decision) {
	hdr.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	hdr.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	hdr.Set("X-RateLimit-Reset", strconv.FormatInt(d.ResetUnix(), 10))
}

// refusal is the JSON body of a 429.
type refusal struct {
	Error      string `json:"error"`
	Message    string `json:"message"`
	Zone       string `json:"zone"`
	RetryAfter int64  `json:"retry_after"`
}

// refuse writes the 429 response.
func refuse(w http.ResponseWriter, z *Zone, d limiter.Decision) error {
	retry := d.RetryAfterSeconds()
	body, err := json.Marshal(refusal{
		Error:      "rate limit exceeded",
		Message:    fmt.Sprintf("You have exceeded the rate limit of %s. Try again in %s.", z.policy, seconds(retry)),
		Zone:       z.name,
		RetryAfter: retry,
	})
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	hdr := w.Header()
	hdr.Set("Retry-After", strconv.FormatInt(retry, 10))
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(append(body, '\n')) // a client that left needs no answer
	return nil
}

func seconds(n int64) string {
	if n == 1 {
		return "1 second"
	}
	return strconv.FormatInt(n, 10) + " seconds"
}

// stores holds the stores shared by every handler and kept across config
// reloads, so that counters survive a reload.
var stores = caddy.NewUsagePool()

// memoryPoolKey names the in-memory store in stores.
const memoryPoolKey = "memory"

// pooledStore makes a store a caddy.Destructor.
type pooledStore struct{ limiter.Store }

func (p pooledStore) Destruct() error { return p.Close() }

// loadMemoryStore acquires the process's in-memory store; the handler
// releases it with stores.Delete(key) in Cleanup.
func loadMemoryStore() (store limiter.Store, key string, err error) {
	v, _, err := stores.LoadOrNew(memoryPoolKey, func() (caddy.Destructor, error) {
		return pooledStore{limiter.NewMemoryStore(0)}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(pooledStore).Store, memoryPoolKey, nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
