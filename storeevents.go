package ratelimit

import (
	"cmp"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// What the limiter tells besides its verdicts, told on to Caddy's logs and
// the metrics: the events of decisions (limiter.Events), of the Redis
// nodes' breakers (limiter.NodeEvents), of the links to the peer regions
// (limiter.RegionEvents), of a storage that distributed syncs through
// (limiter.StorageEvents), of the rounds of the zones that sync
// (limiter.SyncEvents) and of the run-time overrides (overrides.Events).

// decisionEvents are what a handler's decisions tell besides their
// verdicts (limiter.Events): logged with the handler's logger, the bans
// counted in the metrics.
type decisionEvents struct {
	logger *zap.Logger
	mode   string // on_store_error's mode
}

// StoreFailing logs, once, that Redis began to fail.
func (e decisionEvents) StoreFailing(err error) {
	msg := "redis store failing; on_store_error applies until it answers again"
	if limiter.AuthFailed(err) {
		msg = "redis store failing: it refuses the credentials (check username, password and the ACL user's permissions); on_store_error applies until it accepts them"
	}
	e.logger.Error(msg, zap.String("on_store_error", e.mode), zap.Error(err))
}

// StoreRecovered logs, once, that a Redis node answers again.
func (e decisionEvents) StoreRecovered(node string) {
	if node == "" {
		e.logger.Info("redis store available again; decisions are shared again")
		return
	}
	e.logger.Info("redis store available again; decisions are shared again", zap.String("node", node))
}

// ScriptFailed logs a failed script: at error level when loud (at most
// every limiter.ScriptErrorReportEvery), else at debug.
func (e decisionEvents) ScriptFailed(err error, loud bool) {
	if loud {
		e.logger.Error("rate limit script failed for a request; on_store_error applies to it alone (logged at most every 10s)",
			zap.String("on_store_error", e.mode), zap.Error(err))
		return
	}
	e.logger.Debug("rate limit script failed for a request", zap.Error(err))
}

// BanStarted counts a ban (the handler logs it with its request:
// refusallog.go).
func (e decisionEvents) BanStarted(zone string, _ time.Duration) {
	metrics.bans.WithLabelValues(zone).Inc()
}

// Debug logs at debug level.
func (e decisionEvents) Debug(msg string, err error) { e.logger.Debug(msg, zap.Error(err)) }

// BreakerChanged shows a Redis node's breaker in the metrics and logs.
func (s *sharedStore) BreakerChanged(node string, open bool) {
	label := cmp.Or(node, s.whole)
	s.nodes.Store(label, true)
	if !open {
		metrics.breakerOpen.WithLabelValues(label).Set(0)
		s.logger.Info("redis circuit breaker closed: the node decides again", zap.String("node", label))
		return
	}
	metrics.breakerOpen.WithLabelValues(label).Set(1)
	s.logger.Warn("redis circuit breaker open: skipping the node; its keys use on_store_error",
		zap.String("node", label), zap.Duration("cooldown", limiter.BreakerCooldown))
}

// NodeGone drops the breaker metric of a cluster node that no longer
// serves slots.
func (s *sharedStore) NodeGone(node string) {
	if _, shown := s.nodes.LoadAndDelete(node); shown {
		metrics.breakerOpen.DeleteLabelValues(node)
	}
}

// regionEvents logs the links to the peer regions and counts their
// exchanges (regions.Events).
type regionEvents struct{ s *sharedStore }

func (e regionEvents) LinkChanged(peer string, up bool, err error) {
	regionMetrics.linkUp.WithLabelValues(peer).Set(boolGauge(up))
	if up {
		e.s.logger.Info("the link to a region is back: global zones count its admissions again", zap.String("region", peer))
		return
	}
	e.s.logger.Warn("the link to a region is down: global zones decide with this region's share of their rate until it is back, adding no latency",
		zap.String("region", peer), zap.Error(err))
}

func (e regionEvents) Exchanged(peer string, keys int, took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	} else {
		regionMetrics.lastExchange.WithLabelValues(peer).SetToCurrentTime()
	}
	regionMetrics.exchanges.WithLabelValues(peer, result).Inc()
	regionMetrics.exchangedKeys.WithLabelValues(peer).Add(float64(keys))
	regionMetrics.exchangeDuration.WithLabelValues(peer).Observe(took.Seconds())
}

func (e regionEvents) Heard(peer string, heard bool) {
	regionMetrics.heard.WithLabelValues(peer).Set(boolGauge(heard))
	if heard {
		e.s.logger.Info("a region is heard from again: global zones count its admissions again", zap.String("region", peer))
		return
	}
	e.s.logger.Warn("a region is not heard from (its mark is missing from this region's Redis): global zones count it at its share of their rate until it is",
		zap.String("region", peer))
}

func (e regionEvents) Dropped(peer string, n int) {
	if peer == "" {
		peer = "all" // more buckets than an instance keeps counts of
	}
	regionMetrics.dropped.WithLabelValues(peer).Add(float64(n))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// storageEvents logs the storage's failures (limiter.StorageEvents).
type storageEvents struct{ s *sharedStore }

// label is the store's, in the logs: its namespace (s.Limiter is not set
// during the first read, which limiter.New makes).
func (e storageEvents) label() string { return e.s.namespace }

func (e storageEvents) StorageFailing(err error) {
	e.s.logger.Warn("the storage of distributed fails: each instance admits its share of the zones' limits (as on_store_error local) until it answers",
		zap.String("store", e.label()), zap.Error(err))
}

func (e storageEvents) StorageRecovered() {
	e.s.logger.Info("the storage of distributed answers again", zap.String("store", e.label()))
}

func (e storageEvents) FileSkipped(name string, err error) {
	e.s.logger.Warn("an instance's counts in the storage of distributed cannot be used: skipped",
		zap.String("store", e.label()), zap.String("file", name), zap.Error(err))
}
