package ratelimit

import (
	"cmp"
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// stores holds the stores shared by every handler and kept across config
// reloads, so that counters survive a reload and Redis connections are
// reused: the memory store, and one per distinct Redis configuration. A
// store is closed when the last handler using it is cleaned up.
var stores = caddy.NewUsagePool()

// memoryPoolKey names the memory store in stores.
const memoryPoolKey = "memory"

// sharedStore is a store in stores: the limiter the handlers decide with,
// and the metrics and logs of its Redis nodes (limiter.NodeEvents).
type sharedStore struct {
	*limiter.Limiter
	logger *zap.Logger
	whole  string   // a Redis node's label outside a cluster: the addresses
	nodes  sync.Map // the breakers' node labels shown in metrics
}

func newSharedStore(whole string) *sharedStore {
	return &sharedStore{logger: caddy.Log().Named("http.handlers.rate_limit"), whole: whole}
}

func newMemoryStore() (caddy.Destructor, error) {
	s := newSharedStore("")
	s.Limiter = limiter.NewMemoryLimiter()
	return s, nil
}

// Destruct closes the store, when the last handler using it is cleaned up.
func (s *sharedStore) Destruct() error {
	s.nodes.Range(func(label, _ any) bool { // this Redis is no longer used
		metrics.breakerOpen.DeleteLabelValues(label.(string))
		return true
	})
	return s.Close()
}

// provisionStore acquires the store of h: Redis's when configured, else
// the memory store.
func (h *Handler) provisionStore() error {
	if h.Redis != nil {
		return h.provisionRedis()
	}
	return h.loadStore(memoryPoolKey, newMemoryStore)
}

// loadStore acquires the store under key; releaseStore releases it.
func (h *Handler) loadStore(key string, construct caddy.Constructor) error {
	v, _, err := stores.LoadOrNew(key, construct)
	if err != nil {
		return fmt.Errorf("loading store: %w", err)
	}
	h.store, h.poolKey = v.(*sharedStore), key
	return nil
}

// releaseStore releases h's store, once.
func (h *Handler) releaseStore() error {
	if h.poolKey == "" {
		return nil
	}
	_, err := stores.Delete(h.poolKey)
	h.poolKey = ""
	return err
}

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
