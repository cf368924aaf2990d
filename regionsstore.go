package ratelimit

// The exchange of a Redis store's global zones with the other regions
// (package limiter/regions): its peers' options, its links in the
// metrics and logs, and the bounds of its global zones.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// defaultPeerTimeout is a peer region's Redis timeout when its block sets
// none: a round trip between regions takes 70-150 ms, more than a
// region's own Redis's default.
const defaultPeerTimeout = time.Second

// regionsKey names the regions of c in a store's pool key: handlers of one
// Redis with different regions have stores of their own.
func (c *RegionsConfig) regionsKey() (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return " regions:" + hex.EncodeToString(sum[:]), nil
}

// limiterRegions are the regions of c as the limiter takes them: each
// peer's Redis resolved as a redis block is, with defaultPeerTimeout when
// its block sets no timeout.
func (c *RegionsConfig) limiterRegions() (*limiter.Regions, error) {
	r := &limiter.Regions{This: c.This, Peers: map[string]limiter.RedisOptions{}, Interval: c.interval()}
	for _, name := range slices.Sorted(maps.Keys(c.Peers)) {
		cfg := *c.Peers[name]
		if cfg.Timeout == 0 {
			cfg.Timeout = caddy.Duration(defaultPeerTimeout)
		}
		o, err := cfg.limiterOptions()
		if err != nil {
			return nil, fmt.Errorf("regions: region %q: redis: %w", name, err)
		}
		r.Peers[name] = *o
	}
	return r, nil
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

// logRegionBounds logs, for each global zone of h, the regions, and how
// far beyond the world's exact limit they may admit together over any
// period while their links are up (regions.Bound).
func (h *Handler) logRegionBounds() {
	names := h.store.Regions()
	if names == nil {
		return
	}
	links, counted := h.store.RegionLinks()
	down := []string{}
	for _, l := range links {
		regionMetrics.linkUp.WithLabelValues(l.Region).Set(boolGauge(l.Up))
		regionMetrics.heard.WithLabelValues(l.Region).Set(boolGauge(l.Heard))
		if !l.Up {
			down = append(down, l.Region)
		}
	}
	for _, z := range h.zones {
		if !z.Global {
			continue
		}
		share := h.store.RegionShare(z.policy)
		h.logger.Info("zone is global: each region decides from its own Redis with its share of the burst, and tells the others what it admitted every sync; over any period the regions together may admit beyond the exact limit up to (regions × ⌈burst / regions⌉ − burst) + (regions − 1) × rate × (sync + timeout)",
			zap.String("zone", z.name), zap.Strings("regions", names), zap.Strings("links_down", down),
			zap.Int("regions_counted", counted), zap.Duration("sync", h.Regions.interval()),
			zap.Int64("burst_here", share.Burst), zap.Float64("bound", math.Round(h.store.RegionBound(z.policy))))
	}
}
