package ratelimit

// The exchange of a Redis store's global zones with the other regions
// (package limiter/regions): built with the store, the peers' clients
// closed with it, its links in the metrics and logs.

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
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

// peerStores are the Redis stores of a store's peer regions.
type peerStores struct {
	mu     sync.Mutex
	stores []*redisstore.Store
	copies *overrideCopies // the changes of the global zones' overrides to copy to them
}

func (p *peerStores) close() {
	if p.copies != nil {
		p.copies.close()
		for name := range p.copies.peers { // a store of the same peers recreates them at its next exchange
			deleteRegionSeries(name)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.stores {
		_ = s.Close()
	}
	p.stores = nil
}

// startRegions gives s the exchange of c, with a client of each peer's
// Redis; prefix is this region's key prefix, which the peers' must be.
func (s *sharedStore) startRegions(c *RegionsConfig) error {
	peers := map[string]regions.Peer{}
	writers := map[string]*overrides.Writer{}
	timeout := time.Duration(0)
	for _, name := range slices.Sorted(maps.Keys(c.Peers)) {
		st, w, t, err := peerStore(c.Peers[name])
		if err != nil {
			s.peers.close()
			return fmt.Errorf("regions: region %q: %w", name, err)
		}
		s.peers.mu.Lock()
		s.peers.stores = append(s.peers.stores, st)
		s.peers.mu.Unlock()
		peers[name], writers[name], timeout = st, w, max(timeout, t)
	}
	x := regions.New(regions.Config{This: c.This, Home: s.Redis(), Peers: peers, Interval: c.interval(), Timeout: timeout})
	x.OnEvents(regionEvents{s})
	s.Limiter.SetRegions(x)
	s.peers.copies = newOverrideCopies(writers, c.interval(), timeout)
	return nil
}

// peerStore is the store of a peer region's Redis, the writer of its
// overrides, and its timeout.
func peerStore(c *RedisConfig) (*redisstore.Store, *overrides.Writer, time.Duration, error) {
	cfg := *c
	if cfg.Timeout == 0 {
		cfg.Timeout = caddy.Duration(defaultPeerTimeout)
	}
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("redis: %w", err)
	}
	files, err := cfg.TLS.read()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("redis: tls: %w", err)
	}
	opts, err := cfg.options(files)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("redis: %w", err)
	}
	client := redis.NewUniversalClient(opts)
	st, err := redisstore.New(client, cfg.KeyPrefix)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("redis: %w", err)
	}
	w := overrides.NewRedisWriter(client, cmp.Or(cfg.KeyPrefix, redisstore.DefaultKeyPrefix), cfg.DB)
	return st, w, time.Duration(cfg.Timeout), nil
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
	x := h.store.Regions()
	if x == nil {
		return
	}
	links, counted := x.Links()
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
		share := x.Policy(z.policy)
		h.logger.Info("zone is global: each region decides from its own Redis with its share of the burst, and tells the others what it admitted every sync; over any period the regions together may admit beyond the exact limit up to (regions × ⌈burst / regions⌉ − burst) + (regions − 1) × rate × (sync + timeout)",
			zap.String("zone", z.name), zap.Strings("regions", x.Names()), zap.Strings("links_down", down),
			zap.Int("regions_counted", counted), zap.Duration("sync", h.Regions.interval()),
			zap.Int64("burst_here", share.Burst), zap.Float64("bound", math.Round(x.Bound(z.policy))))
	}
}
