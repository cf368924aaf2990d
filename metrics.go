package ratelimit

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the limiter's Prometheus collectors. They live as long as
// the process, so that counts go on across config reloads, and are
// registered in the metrics registry of every config that loads a handler.
// Labels are bounded by the config: zone names, results, store kinds;
// never client keys.
var metrics = struct {
	once         sync.Once
	decisions    *prometheus.CounterVec
	storeLatency *prometheus.HistogramVec
	storeErrors  *prometheus.CounterVec
	breakerOpen  *prometheus.GaugeVec
	scriptErrors prometheus.Counter
	cacheHits    *prometheus.CounterVec
	bans         *prometheus.CounterVec
	jwksFetches  *prometheus.CounterVec
	jwksAge      prometheus.Collector
}{}

// Decision results, the values of the "result" label.
const (
	resultAllowed    = "allowed"
	resultDenied     = "denied"
	resultDryRun     = "dry_run"     // a dry-run zone would have refused
	resultStoreError = "store_error" // decided by on_store_error
	resultBanned     = "banned"      // refused by a ban
)

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
	metrics.storeLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
		Help:    "Time a decision took in its store (memory or redis), errors included.",
		Buckets: prometheus.ExponentialBuckets(0.00005, 2.5, 12), // 50µs to 1.2s
	}, []string{"store"})
	metrics.storeErrors = counterVec("store_errors_total",
		"Store calls that failed (timeouts, connection errors, an open circuit breaker, script errors).", "store")
	metrics.breakerOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "circuit_breaker_open",
		Help: "1 while the circuit breaker of a Redis node is open (the node is skipped), else 0; node is a cluster master's address, or the configured addresses outside a cluster.",
	}, []string{"node"})
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
}

// registerMetrics registers the collectors in reg (once per registry).
func registerMetrics(reg *prometheus.Registry) error {
	metrics.once.Do(initMetrics)
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metrics.decisions, metrics.storeLatency, metrics.storeErrors, metrics.breakerOpen, metrics.scriptErrors, metrics.cacheHits, metrics.bans, metrics.jwksFetches, metrics.jwksAge} {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &already) {
			return err
		}
	}
	return nil
}

// recordDecisions adds the decisions of a verdict to the metrics, a
// result per zone asked; dryRun means that refusals were not enforced.
func recordDecisions(zones []*Zone, v verdict, dryRun bool) {
	for i, z := range zones {
		var result int
		switch {
		case z.noMetrics: // disable_metrics
			continue
		case v.storeFailed:
			result = storeErrorIndex
		case v.decisions[i].Limit == 0: // not asked: another zone refused first
			continue
		case v.decisions[i].Banned:
			result = bannedIndex
		case !v.decisions[i].Allowed && dryRun:
			result = dryRunIndex
		case v.decisions[i].Allowed:
			result = allowedIndex
		default:
			result = deniedIndex
		}
		z.counters.get(z.name, result).Inc()
	}
}

// The results of decisions, as indexes of resultNames.
const (
	allowedIndex = iota
	deniedIndex
	dryRunIndex
	storeErrorIndex
	bannedIndex
)

var resultNames = [...]string{resultAllowed, resultDenied, resultDryRun, resultStoreError, resultBanned}

// decisionCounters are a zone's series of decisions_total, by result, each
// looked up in the vector when first counted (as WithLabelValues would
// per request: the labels hashed, the vector's lock taken), then kept.
type decisionCounters [len(resultNames)]atomic.Pointer[prometheus.Counter]

func (c *decisionCounters) get(zone string, result int) prometheus.Counter {
	if p := c[result].Load(); p != nil {
		return *p
	}
	counter := metrics.decisions.WithLabelValues(zone, resultNames[result])
	c[result].Store(&counter)
	return counter
}

// memoryLatency is store_duration_seconds{store="memory"}, looked up once.
var memoryLatency = sync.OnceValue(func() prometheus.Observer {
	return metrics.storeLatency.WithLabelValues("memory")
})
