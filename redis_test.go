package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// TestClockSkew: two instances whose clocks differ by ten minutes share
// one limit through Redis, and tell clients the same reset time, since
// decisions use the Redis server's clock.
func TestClockSkew(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	prefix := fmt.Sprintf("skew%x:", rand.Uint64())
	instance := func(skew time.Duration, poolSize int) *Handler {
		h := &Handler{
			Zones: map[string]*Zone{"api": {Key: "{http.request.header.X-Key}", Rate: "1r/m", Burst: "5"}},
			// Distinct pool sizes: distinct clients, as on two machines.
			Redis: &RedisConfig{Addresses: addrs, KeyPrefix: prefix, PoolSize: poolSize},
			now:   func() time.Time { return time.Now().Add(skew) },
		}
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	fleet := []*Handler{instance(-5*time.Minute, 3), instance(5*time.Minute, 4)}
	if fleet[0].backend == fleet[1].backend {
		t.Fatal("the two instances share a backend")
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Key", "client")
	allowed := 0
	resets := map[string]bool{}
	for i := range 12 {
		w := serve(fleet[i%2], r)
		if w.Code == http.StatusOK {
			allowed++
		} else { // the bucket is empty and unchanged: one reset time
			resets[w.Header().Get("X-RateLimit-Reset")] = true
		}
	}
	if allowed != 5 {
		t.Fatalf("%d allowed across skewed instances; want the burst, 5", allowed)
	}
	if len(resets) > 2 { // the second may tick between requests
		t.Fatalf("instances disagree on X-RateLimit-Reset: %v", resets)
	}
}

// TestBreakerProbeOfALeavingClient: a probe whose client has gone still
// completes, so the breaker closes and Redis decides again.
func TestBreakerProbeOfALeavingClient(t *testing.T) {
	h := &Handler{
		Zones: map[string]*Zone{"api": {Key: "{http.request.header.X-Key}", Rate: "1r/m", Burst: "5"}},
		Redis: &RedisConfig{Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("probe%x:", rand.Uint64())},
	}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	b := h.backend.breaker
	past := time.Now().Add(-time.Minute)
	for range breakerFailures {
		b.Failure(past)
	}
	if !b.Open() {
		t.Fatal("breaker not open")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	r.Header.Set("X-Key", "k")
	serve(h, r) // the probe, for a client that left
	if b.Open() {
		t.Fatal("the breaker stayed open after a probe whose client left")
	}
	r = httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Key", "k")
	w := serve(h, r)
	if w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Remaining") != "3" {
		t.Fatalf("after the probe: status %d, remaining %q; want a Redis decision", w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
}

// redisHandler provisions a handler with one zone (burst 5) on Redis,
// failing closed so that a Redis that cannot be used shows as 503.
func redisHandler(t *testing.T, cfg *RedisConfig) *Handler {
	t.Helper()
	cfg.KeyPrefix = fmt.Sprintf("t%x:", rand.Uint64())
	h := &Handler{
		Zones:        map[string]*Zone{"api": {Key: "{http.request.header.X-Key}", Rate: "1r/m", Burst: "5"}},
		Redis:        cfg,
		OnStoreError: &StoreErrorPolicy{Mode: "deny"},
	}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	return h
}

func keyRequest(key string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Key", key)
	return r
}

func TestRedisTLS(t *testing.T) {
	_, addr, files := redistest.NewTLSServer(t)
	h := redisHandler(t, &RedisConfig{Addresses: []string{addr},
		TLS: &RedisTLS{CA: files.CA, Cert: files.Cert, Key: files.Key}})
	for _, want := range []string{"4", "3"} {
		if w := serve(h, keyRequest("k")); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != want {
			t.Fatalf("over TLS: status %d, remaining %q; want 200, %s", w.Code, w.Header().Get("X-RateLimit-Remaining"), want)
		}
	}
	// Without a client certificate the server refuses: deny applies.
	h = redisHandler(t, &RedisConfig{Addresses: []string{addr}, TLS: &RedisTLS{CA: files.CA}})
	if w := serve(h, keyRequest("k")); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("TLS without a client certificate: status %d; want 503", w.Code)
	}
}

func TestRedisSentinel(t *testing.T) {
	master := redistest.NewServer(t)
	sentinel := redistest.NewSentinel(t, "rlmaster", master.Addr)
	h := redisHandler(t, &RedisConfig{Addresses: []string{sentinel}, MasterName: "rlmaster"})
	for _, want := range []string{"4", "3"} {
		if w := serve(h, keyRequest("k")); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != want {
			t.Fatalf("through Sentinel: status %d, remaining %q; want 200, %s", w.Code, w.Header().Get("X-RateLimit-Remaining"), want)
		}
	}
	c := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer c.Close()
	if n, err := c.DBSize(context.Background()).Result(); err != nil || n != 1 {
		t.Fatalf("master holds %d keys (%v); want the one bucket", n, err)
	}
}
