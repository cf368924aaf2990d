package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"go.uber.org/zap"
)

// backends holds the backends shared by every handler and kept across
// config reloads, so that counters survive a reload and Redis connections
// are reused: the memory backend, and one per distinct Redis
// configuration. A backend is destructed when the last handler using it
// is cleaned up.
var backends = caddy.NewUsagePool()

// memoryPoolKey names the memory backend in backends.
const memoryPoolKey = "memory"

// backend is what handlers decide with: the memory store alone, or Redis
// with its circuit breaker, its cache of refused clients, and the memory
// store for on_store_error local.
type backend struct {
	redis   *limiter.RedisStore // nil for the memory backend; holds a circuit breaker per node
	memory  *limiter.MemoryStore
	refused *limiter.DenyCache // clients Redis refused, refused here until they could pass; nil without Redis
	failing atomic.Bool        // Redis failed last time: on_store_error applies
	retries *releaseRetries    // releases to try again; nil without Redis
	nodes   sync.Map           // the breakers' node labels shown in metrics
	// scriptErrorLogged is when a failed script was last logged at error
	// level (Unix ns).
	scriptErrorLogged atomic.Int64
}

func newMemoryBackend() (caddy.Destructor, error) {
	return &backend{memory: limiter.NewMemoryStore(0)}, nil
}

// Destruct closes the stores, when the last handler using them is cleaned up.
func (b *backend) Destruct() error {
	b.nodes.Range(func(label, _ any) bool { // this Redis is no longer used
		metrics.breakerOpen.DeleteLabelValues(label.(string))
		return true
	})
	if b.retries != nil {
		b.retries.stop()
	}
	err := b.memory.Close()
	if b.redis != nil {
		err = errors.Join(err, b.redis.Close())
	}
	return err
}

// provisionBackend acquires the backend of h: Redis's when configured,
// else the memory backend.
func (h *Handler) provisionBackend() error {
	if h.Redis != nil {
		return h.provisionRedis()
	}
	return h.loadBackend(memoryPoolKey, newMemoryBackend)
}

// loadBackend acquires the backend under key; releaseBackend releases it.
func (h *Handler) loadBackend(key string, construct caddy.Constructor) error {
	v, _, err := backends.LoadOrNew(key, construct)
	if err != nil {
		return fmt.Errorf("loading store: %w", err)
	}
	h.backend, h.poolKey = v.(*backend), key
	return nil
}

// releaseBackend releases h's backend, once.
func (h *Handler) releaseBackend() error {
	if h.poolKey == "" {
		return nil
	}
	_, err := backends.Delete(h.poolKey)
	h.poolKey = ""
	return err
}

// verdict is what the stores decided for a request's zones.
type verdict struct {
	// reqs are the request's zones (but the dry-run ones) as the stores
	// saw them, and zones the zones themselves.
	reqs  []limiter.Request
	zones []*Zone
	// decisions[i] answers the request's i-th zone. A zero decision
	// (Limit 0) is a zone not asked: another zone refused first, from a
	// ban or the cache of refused clients.
	decisions []limiter.Decision
	// release gives back the concurrency slots taken; nil when none were.
	release release
	// storeFailed is true when on_store_error decided, Redis having failed.
	storeFailed bool
	// unlimited is true when the request passes without limits
	// (on_store_error allow); decisions is then nil.
	unlimited bool
	// err refuses the request with on_store_error deny's status.
	err error
}

// decide decides reqs: a ban refuses at once; else the stores charge
// every zone, all or nothing. The decisions are counted in the metrics,
// and refusals toward bans.
func (h *Handler) decide(ctx context.Context, reqs []limiter.Request, zones []*Zone) verdict {
	v, banned := h.banned(ctx, reqs)
	if !banned {
		v = h.take(ctx, reqs)
	}
	v.reqs, v.zones = reqs, zones
	recordDecisions(zones, v, false)
	if !banned {
		h.countRefusals(ctx, reqs, v.decisions)
	}
	return v
}

// take decides reqs with Redis when configured, else in memory. When Redis
// cannot decide, on_store_error decides.
func (h *Handler) take(ctx context.Context, reqs []limiter.Request) verdict {
	b := h.backend
	if b.redis == nil {
		start := time.Now()
		now := start // one clock reading, unless a test set the clock
		if !h.wallNow {
			now = h.now()
		}
		d := b.memory.TakeAt(now, reqs)
		memoryLatency().Observe(time.Since(start).Seconds())
		return verdict{decisions: d, release: h.holdSlots(b.memory, reqs, d)}
	}
	d, err := h.takeRedis(ctx, reqs)
	switch {
	case err == nil:
		return verdict{decisions: d, release: h.holdSlots(b.redis, reqs, d)}
	case limiter.Unavailable(err):
		return h.storeFailed(reqs, err)
	}
	return h.scriptFailed(reqs, err)
}

// takeRedis asks Redis, within the timeout, unless a node's breaker is
// open (the store keeps one per node). A client that leaves does not cut
// the call short: every call that starts ends as a success or a failure of
// its node's breaker (a probe included), and a script is sent at most once.
func (h *Handler) takeRedis(ctx context.Context, reqs []limiter.Request) ([]limiter.Decision, error) {
	b, now := h.backend, h.now()
	if d, hit := h.cachedRefusal(reqs, now); hit {
		return d, nil
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.timeout)
	start := time.Now()
	decisions, err := b.redis.Take(tctx, reqs)
	metrics.storeLatency.WithLabelValues("redis").Observe(time.Since(start).Seconds())
	cancel()
	var refund *limiter.RefundError
	if errors.As(err, &refund) { // the request is refused either way
		h.logger.Debug("refund of a refused request failed; its tokens stay taken", zap.Error(err))
		go h.releaseSlots(b.redis, reqs) // its concurrency slots, at least
		err = nil
	}
	if err != nil {
		metrics.storeErrors.WithLabelValues("redis").Inc()
		if limiter.MayHaveRun(err) { // a script may have taken slots before the error
			go h.releaseSlots(b.redis, reqs)
		}
		return nil, err
	}
	for i, d := range decisions {
		b.refused.Put(reqs[i], d, now)
	}
	if b.failing.Load() && b.failing.CompareAndSwap(true, false) {
		h.logger.Info("redis store available again; decisions are shared again")
	}
	return decisions, nil
}

// cachedRefusal answers a request that a zone refused lately from the
// cache of refused clients, without Redis: the refusing zone's decision,
// and zero decisions (not asked) for the others.
func (h *Handler) cachedRefusal(reqs []limiter.Request, now time.Time) ([]limiter.Decision, bool) {
	for i, r := range reqs {
		d, hit := h.backend.refused.Get(r, now)
		if !hit {
			continue
		}
		metrics.cacheHits.WithLabelValues(r.Zone).Inc()
		decisions := make([]limiter.Decision, len(reqs))
		decisions[i] = d
		return decisions, true
	}
	return nil, false
}
