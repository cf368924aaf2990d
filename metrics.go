package ratelimit

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// metrics are the limiter's Prometheus collectors. They live as long as
// the process, so that counts go on across config reloads, and are
// registered in the metrics registry of every config that loads a handler.
// Labels are bounded by the config: zone names, results, store kinds;
// never client keys.
var metrics = struct {
	once      sync.Once
	decisions *prometheus.CounterVec
	// fallbackDecisions: the decisions of on_store_error, by what it
	// decided.
	fallbackDecisions *prometheus.CounterVec
	storeLatency      *prometheus.HistogramVec
	storeErrors       *prometheus.CounterVec
	breakerOpen       *prometheus.GaugeVec
	overrides         *prometheus.GaugeVec
	// overridesRestored: overrides written back to a Redis that lost
	// them, by store.
	overridesRestored *prometheus.CounterVec
	syncs             *prometheus.CounterVec
	syncDuration      prometheus.Histogram
	syncedKeys        prometheus.Counter
	scriptErrors      prometheus.Counter
	cacheHits         *prometheus.CounterVec
	bans              *prometheus.CounterVec
	jwksFetches       *prometheus.CounterVec
	jwksAge           prometheus.Collector
	// memoryEvictions: buckets the memory stores evicted, being full.
	memoryEvictions prometheus.Counter
}{}

// The namespace and subsystem of every metric: caddy_rate_limit_*.
const metricsNamespace, metricsSubsystem = "caddy", "rate_limit"

// counterVec is a counter caddy_rate_limit_<name> with labels.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help,
	}, labels)
}

func initMetrics() {
	const ns, sub = metricsNamespace, metricsSubsystem
	metrics.decisions = counterVec("decisions_total",
		"Decisions by zone and result: allowed, denied, banned, dry_run (a dry-run zone would have refused), store_error (decided by on_store_error).",
		"zone", "result")
	metrics.fallbackDecisions = counterVec("store_error_decisions_total",
		"Decisions made by on_store_error (counted as store_error in decisions_total), by zone and what it decided: allowed or denied. With local, the memory store's decision; allow allows every request, deny denies every one.",
		"zone", "decision")
	metrics.storeLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
		Help:    "Time a decision took in its store (memory, redis, or sync: a zone that syncs, decided in this instance), errors included.",
		Buckets: prometheus.ExponentialBuckets(0.00005, 2.5, 12), // 50µs to 1.2s
	}, []string{"store"})
	metrics.storeErrors = counterVec("store_errors_total",
		"Store calls that failed (timeouts, connection errors, an open circuit breaker, script errors).", "store")
	metrics.breakerOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "circuit_breaker_open",
		Help: "1 while the circuit breaker of a Redis node is open (the node is skipped), else 0; node is a cluster master's address, or the configured addresses outside a cluster.",
	}, []string{"node"})
	metrics.overrides = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "overrides",
		Help: "Run-time overrides in force, of zones (scope zone) and of client keys (scope key), by store: memory, or the Redis's configured addresses.",
	}, []string{"store", "scope"})
	metrics.overridesRestored = counterVec("overrides_restored_total",
		"Times this instance wrote the run-time overrides it held back to a Redis that had lost them (restarted empty, flushed, or failed over to a replica that lacked the last changes), by store.", "store")
	metrics.syncs = counterVec("syncs_total",
		"Rounds of the zones that sync (sync <interval>) with Redis, or reads of the others' counts in a storage (distributed), by result: ok or error.", "result")
	metrics.syncDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "sync_duration_seconds",
		Help:    "Time a round of the zones that sync took in Redis (or a read of a storage), errors included.",
		Buckets: prometheus.ExponentialBuckets(0.00005, 2.5, 12),
	})
	metrics.syncedKeys = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "synced_keys_total",
		Help: "Buckets synced with Redis by the rounds of the zones that sync (a round charges and reads each in one batched call per node), or read from the others' files in a storage.",
	})
	metrics.scriptErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "script_errors_total",
		Help: "Requests whose Redis script failed in a Redis that answered (decided by on_store_error, counted toward no breaker).",
	})
	metrics.cacheHits = counterVec("local_cache_hits_total",
		"Requests refused from the local cache of refused clients: Redis calls saved.", "zone")
	metrics.bans = counterVec("bans_total", "Bans started: clients refused often enough to be banned.", "zone")
	metrics.jwksFetches = counterVec("jwks_fetches_total",
		"Fetches of JWT keys from a JWKS URL, by configured URL (host and path) and result: ok, error (no answer, timeout, HTTP error status), rejected (not a usable key set, or too large).",
		"jwks", "result")
	metrics.jwksAge = newJWKSAgeCollector()
	metrics.memoryEvictions = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "memory_evictions_total",
		Help: "Buckets the memory store evicted, being full (memory_capacity): a new bucket evicts one that holds nothing back, else the one closest to full. With Redis, the memory store of on_store_error local.",
	})
}

// registerMetrics registers the collectors in reg (once per registry).
func registerMetrics(reg *prometheus.Registry) error {
	metrics.once.Do(func() { initMetrics(); initRegionMetrics() })
	if reg == nil {
		return nil
	}
	for _, c := range append([]prometheus.Collector{metrics.decisions, metrics.fallbackDecisions, metrics.storeLatency, metrics.storeErrors, metrics.breakerOpen, metrics.overrides, metrics.overridesRestored, metrics.syncs, metrics.syncDuration, metrics.syncedKeys, metrics.scriptErrors, metrics.cacheHits, metrics.bans, metrics.jwksFetches, metrics.jwksAge, metrics.memoryEvictions}, regionCollectors()...) {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &already) {
			return err
		}
	}
	return nil
}

// record adds a verdict to the metrics: its store calls, a result per
// zone asked, the refusals answered from the cache of refused clients.
// (What the verdict does not say, the store tells decisionEvents; the
// refusals, and the dry-run zones' would-be refusals, are logged with
// their request: refusallog.go.)
func (h *Handler) record(zones []*Zone, v *limiter.Verdict) {
	for i := range v.Calls {
		recordCall(&v.Calls[i])
	}
	for i, z := range zones {
		state, d := v.States[i], v.Decisions
		if state.Decided() && d[i].Cached {
			metrics.cacheHits.WithLabelValues(z.name).Inc()
		}
		if result := resultOf(state, v.CallOf(i)); result >= 0 && !z.noMetrics {
			z.counters.get(z.name, result).Inc()
			if result == storeErrorIndex {
				z.counters.fallback(z.name, state.Refuses() || state == limiter.WouldRefuse).Inc()
			}
		}
	}
}

// recordCall adds a store call to the latency and error metrics.
func recordCall(c *limiter.Call) {
	switch c.Store {
	case "":
		return
	case "memory":
		storeLatencies().memory.Observe(c.Took.Seconds())
	case "sync":
		storeLatencies().sync.Observe(c.Took.Seconds())
	case "redis":
		storeLatencies().redis.Observe(c.Took.Seconds())
	default:
		metrics.storeLatency.WithLabelValues(c.Store).Observe(c.Took.Seconds())
	}
	if c.Failure != limiter.NoFailure {
		metrics.storeErrors.WithLabelValues(c.Store).Inc()
	}
	if c.Failure == limiter.ScriptFailed {
		metrics.scriptErrors.Inc()
	}
}

// resultOf is the index of the result of a zone in state, decided by
// call; -1 for a zone not asked.
func resultOf(state limiter.State, call *limiter.Call) int {
	switch {
	case call.Failure != limiter.NoFailure:
		return storeErrorIndex
	case state == limiter.NotAsked:
		return -1
	case state == limiter.Banned:
		return bannedIndex
	case state == limiter.WouldRefuse:
		return dryRunIndex
	case state == limiter.Allowed:
		return allowedIndex
	}
	return deniedIndex // Refused, BanStarted
}

// The results of decisions, the values of the "result" label, as indexes
// of resultNames.
const (
	allowedIndex    = iota
	deniedIndex     // refused by a zone
	dryRunIndex     // a dry-run zone would have refused
	storeErrorIndex // decided by on_store_error
	bannedIndex     // refused by a ban
)

var resultNames = [...]string{allowedIndex: "allowed", deniedIndex: "denied", dryRunIndex: "dry_run",
	storeErrorIndex: "store_error", bannedIndex: "banned"}

// decisionCounters are a zone's series of decisions_total, by result, each
// looked up in the vector when first counted (as WithLabelValues would
// per request: the labels hashed, the vector's lock taken), then kept.
// The series of store_error_decisions_total come after them, allowed
// then denied.
type decisionCounters [len(resultNames) + 2]atomic.Pointer[prometheus.Counter]

func (c *decisionCounters) get(zone string, result int) prometheus.Counter {
	if p := c[result].Load(); p != nil {
		return *p
	}
	counter := metrics.decisions.WithLabelValues(zone, resultNames[result])
	c[result].Store(&counter)
	return counter
}

// fallback is the zone's series of store_error_decisions_total for a
// decision of on_store_error: denied, or allowed.
func (c *decisionCounters) fallback(zone string, denied bool) prometheus.Counter {
	i, decision := len(resultNames), "allowed"
	if denied {
		i, decision = i+1, "denied"
	}
	if p := c[i].Load(); p != nil {
		return *p
	}
	counter := metrics.fallbackDecisions.WithLabelValues(zone, decision)
	c[i].Store(&counter)
	return counter
}

// storeLatencies are store_duration_seconds of the stores a call names,
// each looked up once (a lookup by label hashes it: a third of a
// microsecond a request on the synced route).
var storeLatencies = sync.OnceValue(func() struct{ memory, sync, redis prometheus.Observer } {
	return struct{ memory, sync, redis prometheus.Observer }{metrics.storeLatency.WithLabelValues("memory"),
		metrics.storeLatency.WithLabelValues("sync"), metrics.storeLatency.WithLabelValues("redis")}
})

// metricsRegistry is where Provision registers the collectors: Caddy's
// registry, or none with DisableMetrics.
func (h *Handler) metricsRegistry(ctx caddy.Context) *prometheus.Registry {
	if h.DisableMetrics {
		return nil
	}
	return ctx.GetMetricsRegistry()
}

// countSync counts a round of the zones that sync (or a read of the
// others' counts in a storage): its keys, its latency, its result.
func countSync(keys int, took time.Duration, err error) {
	metrics.syncDuration.Observe(took.Seconds())
	metrics.syncedKeys.Add(float64(keys))
	result := "ok"
	if err != nil {
		result = "error"
	}
	metrics.syncs.WithLabelValues(result).Inc()
}
