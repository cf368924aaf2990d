package ratelimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
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
func (s *sharedLimiter) BreakerChanged(node string, open bool) {
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
func (s *sharedLimiter) NodeGone(node string) {
	if _, shown := s.nodes.LoadAndDelete(node); shown {
		metrics.breakerOpen.DeleteLabelValues(node)
	}
}

// regionEvents logs the links to the peer regions and counts their
// exchanges (regions.Events).
type regionEvents struct{ s *sharedLimiter }

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

func (e regionEvents) Flooding(on bool) {
	if !on {
		e.s.logger.Info("global zones' buckets fit in what an instance keeps counts of again: global zones count the other regions again")
		return
	}
	e.s.logger.Warn("more buckets of global zones came than an instance keeps counts of (a flood of distinct keys?): global zones decide with this region's share until they fit (caddy_rate_limit_region_dropped_keys_total counts what was not told)")
}

func (e regionEvents) ConfigDiffers(peer, diff string) {
	regionMetrics.differs.WithLabelValues(peer).Set(boolGauge(diff != ""))
	if diff == "" {
		e.s.logger.Info("a region agrees again on the global zones and the key secret: global zones count it again", zap.String("region", peer))
		return
	}
	e.s.logger.Warn("a region's config differs from this one's (its key_secret, or its global zones' keys, algorithms, rates or bursts): global zones decide with this region's share, and charge it nothing, until they agree",
		zap.String("region", peer), zap.String("differs", diff))
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
type storageEvents struct{ s *sharedLimiter }

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

// InstancesChanged logs the bounds of the zones that sync again, for the
// n instances counted now (fleetsync.Events).
func (s *sharedLimiter) InstancesChanged(n int) {
	s.capacityMu.Lock()
	hs := slices.Collect(maps.Keys(s.syncing))
	s.capacityMu.Unlock()
	for _, h := range hs {
		h.logBounds(n)
	}
}

// Synced counts a round of the zones that sync, and logs when rounds
// start failing and when they work again (fleetsync.Events).
func (s *sharedLimiter) Synced(keys int, took time.Duration, err error) {
	countSync(keys, took, err)
	if err != nil {
		if !s.syncFailing.Swap(true) {
			s.logger.Warn("rounds of the zones that sync fail: "+s.syncFailure(err)+"; each instance admits its share of their limits (as on_store_error local), and what it admits is counted when rounds succeed again",
				zap.String("store", s.label()), zap.Error(err))
		}
		return
	}
	if s.syncFailing.Swap(false) {
		s.logger.Info("zones that sync reach "+s.fleetName()+" again", zap.String("store", s.label()))
	}
}

// syncFailure says what made a round fail: a reply of Redis's that is an
// error (the store answered: the error's code), a time-out, or no answer.
func (s *sharedLimiter) syncFailure(err error) string {
	code, replied := limiter.ReplyCode(err)
	switch {
	case errors.Is(err, limiter.ErrBreakerOpen):
		return "the circuit breaker skips " + s.fleetName() + " after its failures"
	case replied:
		return s.fleetName() + " answered with the error " + code
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return s.fleetName() + " did not answer within the timeout"
	}
	return "cannot reach " + s.fleetName()
}

// isTimeout reports whether err is a network time-out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// fleetName names where the zones that sync share their counts.
func (s *sharedLimiter) fleetName() string {
	if s.Kind() == limiter.StoreStorage {
		return "the storage"
	}
	return "Redis"
}

// overrideEvents logs and counts what happens to a store's overrides
// (overrides.Events).
type overrideEvents struct{ s *sharedLimiter }

// OverridesLoaded counts the overrides now in force, and logs those that
// expired (a zone's on a line of its own, the keys' counted per zone); the
// loads themselves are logged at debug level.
func (e overrideEvents) OverridesLoaded(set *overrides.Set, via string, expired []overrides.Entry) {
	zones, keys := set.Count(time.Now())
	label := e.s.label()
	metrics.overrides.WithLabelValues(label, "zone").Set(float64(zones))
	metrics.overrides.WithLabelValues(label, "key").Set(float64(keys))
	e.s.logger.Debug("rate limit overrides read", zap.String("store", label), zap.String("via", via),
		zap.Int64("version", set.Version()), zap.Int("zones", zones), zap.Int("keys", keys))
	keyed := map[string]int{}
	for _, x := range expired {
		if x.Digest != "" {
			keyed[x.Zone]++
			continue
		}
		e.s.logger.Info("rate limit override expired: the config's limit applies again",
			zap.String("zone", x.Zone), zap.String("kind", x.Kind()), zap.Time("expired", x.ExpiresAt()))
	}
	for _, zone := range slices.Sorted(maps.Keys(keyed)) {
		e.s.logger.Info("rate limit overrides of keys expired: the config's limit applies to them again",
			zap.String("zone", zone), zap.Int("keys", keyed[zone]))
	}
}

// OverridesNotPushed logs that changes arrive through the poll alone.
func (e overrideEvents) OverridesNotPushed(err error) {
	e.s.logger.Warn("rate limit overrides: Redis does not confirm the subscription to their changes, which other instances "+
		"then reach here only at each overrides_poll; if Redis has ACLs, allow the channel (see the Redis docs)",
		zap.String("store", e.s.label()), zap.Error(err))
}

// OverrideSkipped logs an entry that could not be read, a key's named by
// its zone alone (its digest may not be keyed).
func (e overrideEvents) OverrideSkipped(entry string, err error) {
	if rest, ok := strings.CutPrefix(strings.Trim(entry, `"`), "key:"); ok {
		_, zone, _ := strings.Cut(rest, ":")
		entry = fmt.Sprintf("a key's override in zone %.80q", zone)
	}
	e.s.logger.Warn("rate limit override skipped: its entry in the store is not one this version reads",
		zap.String("store", e.s.label()), zap.String("entry", entry), zap.Error(err))
}

// OverridesRestored logs and counts a write-back of the overrides to a
// Redis that lost them.
func (e overrideEvents) OverridesRestored(n int, why string) {
	metrics.overridesRestored.WithLabelValues(e.s.label()).Inc()
	e.s.logger.Warn("rate limit overrides restored: Redis had lost them, and this instance wrote back those it held that had not expired; "+
		"the other instances read them from Redis",
		zap.String("store", e.s.label()), zap.Int("restored", n), zap.String("why", why))
}

// OverridesOverLimit logs that the store holds more overrides than an
// instance reads.
func (e overrideEvents) OverridesOverLimit(held, read int) {
	e.s.logger.Warn("rate limit overrides: the store holds more entries than an instance reads; the rest are left out "+
		"(logged once, until they fit): delete overrides through the admin API, or look for entries written into Redis by hand",
		zap.String("store", e.s.label()), zap.Int("entries", held), zap.Int("read", read))
}

// OverridesFailing logs that the overrides cannot be read, and when they
// can again.
func (e overrideEvents) OverridesFailing(err error) {
	if err != nil {
		e.s.logger.Warn("rate limit overrides cannot be read: the last ones read stay in force until they can",
			zap.String("store", e.s.label()), zap.Error(err))
		return
	}
	e.s.logger.Info("rate limit overrides read again", zap.String("store", e.s.label()))
}

// Interface guard.
var _ overrides.Events = overrideEvents{}
