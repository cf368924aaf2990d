package ratelimit

import (
	"cmp"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// stores holds the stores shared by every handler and kept across config
// reloads, so that counters survive a reload and Redis connections are
// reused: the memory store, and one per distinct Redis configuration. A
// store is closed when the last handler using it is cleaned up.
var stores = caddy.NewUsagePool()

// memoryPoolKey names the memory store in stores. It holds no capacity:
// handlers that set different memory_capacity values share one store, of
// the largest (see sharedLimiter.holdCapacity), so that zones shared by
// handlers stay shared and a reload that changes the capacity keeps the
// buckets.
const memoryPoolKey = "memory"

// sharedLimiter is a limiter in stores, shared by the handlers of one
// store configuration across reloads: the limiter they decide with, what
// its handlers hold of it (capacities, polls, zones that sync), and the
// state of its reports in the metrics and logs (storeevents.go).
type sharedLimiter struct {
	*limiter.Limiter
	overrides   *overrides.Overrides // the Limiter's run-time overrides
	namespace   string               // a Redis store's label (sharedLimiter.label)
	syncFailing atomic.Bool          // the rounds of the zones that sync fail
	logger      *zap.Logger
	whole       string   // a Redis node's label outside a cluster: the addresses
	nodes       sync.Map // the breakers' node labels shown in metrics

	capacityMu sync.Mutex
	capacities map[*Handler]int           // the memory_capacity of each handler that holds the store and sets one
	polls      map[*Handler]time.Duration // the overrides_poll of each handler that sets one
	syncing    map[*Handler]bool          // the handlers with zones that sync (their bounds are logged as N changes)
	// fingerprints are the parts of the regions' fingerprint of each
	// handler that holds the store (regionsfingerprint.go).
	fingerprints map[*Handler]limiter.RegionFingerprint
	poll         time.Duration // the overrides' poll, as last set
	capacity     atomic.Int64  // the memory store's capacity, as last set
	watchOnce    sync.Once     // the evictions are watched
	// evictionLogged is when evictions were last logged (Unix ns);
	// evictedUnlogged, how many came since.
	evictionLogged  atomic.Int64
	evictedUnlogged atomic.Uint64
}

// evictionLogEvery is how often, at most, the memory store's evictions are
// logged.
const evictionLogEvery = time.Minute

func newSharedLimiter(whole string) *sharedLimiter {
	return &sharedLimiter{logger: caddy.Log().Named("http.handlers.rate_limit"), whole: whole}
}

// made completes s with l, the limiter made for it, or fails with err.
func (s *sharedLimiter) made(l *limiter.Limiter, err error) (*sharedLimiter, error) {
	if err != nil {
		return nil, err
	}
	s.Limiter, s.overrides = l, l.Overrides()
	return s, nil
}

func newSharedMemory() (caddy.Destructor, error) {
	s := newSharedLimiter("")
	return s.made(limiter.New(limiter.Config{Overrides: overrideEvents{s}}))
}

// Destruct closes the store, when the last handler using it is cleaned up.
func (s *sharedLimiter) Destruct() error {
	s.nodes.Range(func(label, _ any) bool { // this Redis is no longer used
		metrics.breakerOpen.DeleteLabelValues(label.(string))
		return true
	})
	metrics.overrides.DeletePartialMatch(prometheus.Labels{"store": s.label()})
	err := s.Close()                                              // the last exchange with the peer regions first
	for _, name := range s.Regions()[min(1, len(s.Regions())):] { // the peers: a store of the same peers recreates them at its next exchange
		deleteRegionSeries(name)
	}
	return err
}

// provisionStore acquires the store of h: Redis's when configured, else
// the memory store; h's memory_capacity joins those of the store's other
// handlers.
func (h *Handler) provisionStore() error {
	if n := h.MemoryCapacity; n < 0 || n > 0 && n < limiter.MinMemoryCapacity {
		return fmt.Errorf("memory_capacity %d: want at least %d buckets (0 or none: %d)", n, limiter.MinMemoryCapacity, limiter.DefaultMemoryCapacity)
	}
	var err error
	switch {
	case h.Redis != nil:
		err = h.provisionRedis()
	case h.storage != nil:
		err = h.provisionStorage()
	default:
		err = h.loadStore(memoryPoolKey, newSharedMemory)
	}
	if err != nil {
		return err
	}
	h.store.watchEvictions()
	h.store.holdCapacity(h, h.MemoryCapacity)
	if k := h.store.Kind(); k == limiter.StoreRedis && metrics.storeErrors != nil {
		metrics.storeErrors.WithLabelValues(string(k)) // at 0 from the start: a rate over it works before the first error
	}
	return nil
}

// holdCapacity records the memory_capacity of h (0: none set; -1: h lets
// go of the store) and sets the memory store's capacity to the largest
// that the handlers holding the store set, or else the default. A reload
// provisions the new handlers before it cleans up the old ones: in
// between, the larger of the two configs' capacities applies.
func (s *sharedLimiter) holdCapacity(h *Handler, n int) {
	s.capacityMu.Lock()
	defer s.capacityMu.Unlock()
	switch {
	case n > 0:
		if s.capacities == nil {
			s.capacities = make(map[*Handler]int)
		}
		s.capacities[h] = n
	default:
		delete(s.capacities, h)
	}
	capacity := 0
	for _, c := range s.capacities {
		capacity = max(capacity, c)
	}
	capacity = cmp.Or(capacity, limiter.DefaultMemoryCapacity)
	if int64(capacity) != s.capacity.Load() {
		s.SetMemoryCapacity(capacity)
		s.capacity.Store(int64(capacity))
	}
}

// watchEvictions has the memory store's evictions counted and logged.
func (s *sharedLimiter) watchEvictions() {
	s.watchOnce.Do(func() { s.OnEvict(s.evicted) })
}

// evicted counts n buckets the memory store evicted, being full, and logs
// it at warning level at most once per evictionLogEvery, without any
// client key: the capacity, and the buckets evicted since the last line.
func (s *sharedLimiter) evicted(n int) {
	metrics.memoryEvictions.Add(float64(n))
	s.evictedUnlogged.Add(uint64(n))
	now, last := time.Now().UnixNano(), s.evictionLogged.Load()
	if now-last < int64(evictionLogEvery) || !s.evictionLogged.CompareAndSwap(last, now) {
		return
	}
	msg := "memory store full: new buckets evict those closest to full (raise memory_capacity to keep more)"
	if s.Kind() == limiter.StoreRedis {
		msg = "memory store of on_store_error local full: new buckets evict those closest to full (raise memory_capacity to keep more)"
	}
	s.logger.Warn(msg, zap.Int64("memory_capacity", s.capacity.Load()), zap.Uint64("evicted", s.evictedUnlogged.Swap(0)))
}

// loadStore acquires the store under key; releaseStore releases it.
func (h *Handler) loadStore(key string, construct caddy.Constructor) error {
	v, _, err := stores.LoadOrNew(key, construct)
	if err != nil {
		return fmt.Errorf("loading store: %w", err)
	}
	h.store, h.poolKey = v.(*sharedLimiter), key
	return nil
}

// releaseStore releases h's store, once.
func (h *Handler) releaseStore() error {
	if h.poolKey == "" {
		return nil
	}
	h.store.holdCapacity(h, -1)
	h.store.holdPoll(h, -1)
	h.store.holdSyncing(h, false)
	if h.Regions != nil {
		h.store.holdFingerprint(h, nil)
	}
	_, err := stores.Delete(h.poolKey)
	h.poolKey = ""
	return err
}

// label names the store in the overrides' admin API, metric and logs:
// "memory", or the Redis's addresses, then its db and key prefix when
// they are not the defaults ("10.0.1.2:6379 db 1 prefix api:").
func (s *sharedLimiter) label() string {
	if s.Kind() == limiter.StoreMemory {
		return string(limiter.StoreMemory)
	}
	return s.namespace
}
