package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

func TestCleanupReleasesStore(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"a": {Key: "k", Rate: "1r/s"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	if err := h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if refs, ok := backends.References(memoryPoolKey); ok {
		t.Fatalf("store still has %d references after Cleanup", refs)
	}
}

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
	b := h.backend.redis.Breaker("") // standalone: one breaker
	past := time.Now().Add(-time.Minute)
	for range limiter.BreakerFailures {
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
