// Package ratelimit is a Caddy HTTP handler that limits the rate of
// requests per client: token buckets keyed by Caddy placeholders, kept in
// memory or shared by a fleet of Caddy instances.
package ratelimit

import (
	"cmp"
	"context"
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
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

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

	zones   []*Zone
	backend *backend
	poolKey string
	timeout time.Duration
	onError StoreErrorPolicy
	now     func() time.Time
	logger  *zap.Logger
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

	// Burst is the capacity of the bucket: how many requests may come at
	// once after a quiet period. Default: N of the rate.
	Burst int64 `json:"burst,omitempty"`

	name     string
	matchers caddyhttp.MatcherSets
	policy   limiter.Policy
	local    limiter.Policy // while Redis fails, in local mode
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
	for _, name := range sortedNames(h.Zones) {
		z := h.Zones[name]
		if err = z.provision(ctx, name); err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		if z.local, err = localPolicy(z.policy, h.onError.Instances); err != nil {
			return fmt.Errorf("zone %q: on_store_error local instances %d: %w", name, h.onError.Instances, err)
		}
		h.zones = append(h.zones, z)
	}
	if h.Redis == nil {
		return h.loadBackend(memoryPoolKey, newMemoryBackend)
	}
	return h.provisionRedis()
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

// localPolicy is a zone's share of its limit on one of n instances.
func localPolicy(p limiter.Policy, n int) (limiter.Policy, error) {
	if float64(p.Period)*float64(n) > float64(limiter.MaxPeriod) {
		return limiter.Policy{}, fmt.Errorf("period %s times %d is longer than %s", p.Period, n, limiter.MaxPeriod)
	}
	local := limiter.Policy{Rate: p.Rate, Period: p.Period * time.Duration(n), Burst: max(p.Burst/int64(n), 1)}
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
	decisions, err := h.take(r.Context(), reqs, zones)
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
	z, d := zones[i], decisions[i]
	setPlaceholders(repl, z.name, d)
	setLimitHeaders(w.Header(), d)
	if !d.Allowed {
		h.logger.Debug("rate limited", zap.String("zone", z.name), zap.Int64("retry_after", d.RetryAfterSeconds()))
		return refuse(w, z, d)
	}
	return next.ServeHTTP(w, r)
}

// take decides reqs with Redis when configured, else in memory. When Redis
// fails it applies on_store_error: decisions from the local store, none
// (allow), or an error (deny).
func (h *Handler) take(ctx context.Context, reqs []limiter.Request, zones []*Zone) ([]limiter.Decision, error) {
	b := h.backend
	if b.redis == nil {
		return b.local.TakeAt(h.now(), reqs), nil
	}
	decisions, err := h.takeRedis(ctx, reqs)
	if err != nil {
		return h.storeFailed(reqs, zones, err)
	}
	return decisions, nil
}

// takeRedis asks Redis, within the timeout and unless the breaker is open.
// A client that leaves does not cut the call short: every call that starts
// ends as a success or a failure of the breaker (a probe included), and a
// script that ran is not retried.
func (h *Handler) takeRedis(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	b, now := h.backend, h.now()
	if !b.breaker.Allow(now) {
		return nil, errBreakerOpen
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.timeout)
	decisions, err := b.redis.Take(tctx, reqs)
	cancel()
	var refund *limiter.RefundError
	if errors.As(err, &refund) { // the request is refused either way
		h.logger.Debug("refund of a refused request failed; its tokens stay taken", zap.Error(err))
		err = nil
	}
	if err != nil {
		if b.breaker.Failure(now) {
			h.logger.Warn("redis circuit breaker open: skipping redis", zap.Duration("cooldown", breakerCooldown))
		}
		return nil, err
	}
	b.breaker.Success()
	if b.failing.Load() && b.failing.CompareAndSwap(true, false) {
		h.logger.Info("redis store available again; decisions are shared again")
	}
	return decisions, nil
}

var errBreakerOpen = errors.New("circuit breaker open after consecutive redis failures")

// storeFailed applies on_store_error to a request that Redis did not decide.
func (h *Handler) storeFailed(reqs []limiter.Request, zones []*Zone, err error) ([]limiter.Decision, error) {
	if h.backend.failing.CompareAndSwap(false, true) {
		h.logger.Error("redis store failing; on_store_error applies until it answers again",
			zap.String("on_store_error", h.onError.Mode), zap.Error(err))
	} else {
		h.logger.Debug("redis store failed", zap.Error(err))
	}
	switch h.onError.Mode {
	case "allow":
		return nil, nil
	case "deny":
		return nil, caddyhttp.Error(h.onError.Status, fmt.Errorf("rate limit store: %w", err))
	}
	local := make([]limiter.Request, len(reqs))
	for i, r := range reqs {
		r.Policy = zones[i].local
		local[i] = r
	}
	return h.backend.local.TakeAt(h.now(), local), nil
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
	failing atomic.Bool // Redis failed last time: on_store_error applies
}

func newMemoryBackend() (caddy.Destructor, error) {
	return &backend{local: limiter.NewMemoryStore(0)}, nil
}

// Destruct closes the stores, when the last handler using them is cleaned up.
func (b *backend) Destruct() error {
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
			breaker: limiter.NewBreaker(breakerFailures, breakerCooldown)}, nil
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
