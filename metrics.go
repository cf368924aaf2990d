package ratelimit

import (
	"errors"
	"sync"

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
	breakerOpen  prometheus.Gauge
	cacheHits    *prometheus.CounterVec
	bans         *prometheus.CounterVec
}{}

// Decision results, the values of the "result" label.
const (
	resultAllowed    = "allowed"
	resultDenied     = "denied"
	resultDryRun     = "dry_run"     // a dry-run zone would have refused
	resultStoreError = "store_error" // decided by on_store_error
	resultBanned     = "banned"      // refused by a ban
)

func initMetrics() {
	const ns, sub = "caddy", "rate_limit"
	metrics.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "decisions_total",
		Help: "Decisions by zone and result: allowed, denied, banned, dry_run (a dry-run zone would have refused), store_error (decided by on_store_error).",
	}, []string{"zone", "result"})
	metrics.storeLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
		Help:    "Time a decision took in its store (memory or redis), errors included.",
		Buckets: prometheus.ExponentialBuckets(0.00005, 2.5, 12), // 50µs to 1.2s
	}, []string{"store"})
	metrics.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "store_errors_total",
		Help: "Store calls that failed (timeouts, connection errors, an open circuit breaker).",
	}, []string{"store"})
	metrics.breakerOpen = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "circuit_breaker_open",
		Help: "1 while a Redis circuit breaker is open (Redis is skipped), else 0.",
	})
	metrics.cacheHits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "local_cache_hits_total",
		Help: "Requests refused from the local cache of refused clients: Redis calls saved.",
	}, []string{"zone"})
	metrics.bans = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "bans_total",
		Help: "Bans started: clients refused often enough to be banned.",
	}, []string{"zone"})
}

// registerMetrics registers the collectors in reg (once per registry).
func registerMetrics(reg *prometheus.Registry) error {
	metrics.once.Do(initMetrics)
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{metrics.decisions, metrics.storeLatency, metrics.storeErrors, metrics.breakerOpen, metrics.cacheHits, metrics.bans} {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &already) {
			return err
		}
	}
	return nil
}
