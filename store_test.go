package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

func TestCleanupReleasesStore(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"a": {Key: "k", Rate: "1r/s"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	if err := h.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if refs, ok := stores.References(memoryPoolKey); ok {
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
	if fleet[0].store == fleet[1].store {
		t.Fatal("the two instances share a store")
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
	b := h.store.Breaker("") // standalone: one breaker
	past := time.Now().Add(-time.Minute)
	for range redisstore.BreakerFailures {
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

// Concurrency slots held in Redis, through the handler.

// concurrencyHandler provisions a handler with one max_concurrent 1 zone
// of the given lease on Redis, failing closed.
func concurrencyHandler(t *testing.T, addrs []string, lease time.Duration) *Handler {
	t.Helper()
	h := &Handler{
		Zones: map[string]*Zone{"slots": {Key: "{http.request.header.X-Key}", MaxConcurrent: 1, Lease: caddyDuration(lease)}},
		Redis: &RedisConfig{Addresses: addrs, KeyPrefix: fmt.Sprintf("slots%x:", rand.Uint64())},
		// deny: a request that Redis does not decide shows as 503
		OnStoreError: &StoreErrorPolicy{Mode: "deny"},
	}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	return h
}

// hold starts a request of key that stays in flight until the returned
// function is called; that function waits for the request's end and
// returns its status.
func hold(t *testing.T, h *Handler, key string) (end func() int) {
	t.Helper()
	entered, leave := make(chan struct{}), make(chan struct{})
	done := make(chan int, 1)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		close(entered)
		<-leave
		w.WriteHeader(http.StatusOK)
		return nil
	})
	go func() { done <- serveWith(h, keyRequest(key), next).Code }()
	select {
	case <-entered:
	case code := <-done:
		t.Fatalf("the held request was answered %d", code)
	}
	return func() int {
		close(leave)
		return <-done
	}
}

// serveWith is serve with another next handler.
func serveWith(h *Handler, r *http.Request, next caddyhttp.Handler) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r = r.Clone(r.Context())
	caddyhttp.NewTestReplacer(r)
	if err := h.ServeHTTP(w, r, next); err != nil {
		w.Code = http.StatusInternalServerError
		if he, ok := err.(caddyhttp.HandlerError); ok {
			w.Code = he.StatusCode
		}
	}
	return w
}

// TestReleaseWhileBreakerOpen: a request that ends while the breaker is
// open still gives its slot back, so that its client is not refused with
// nothing in flight until the lease expires.
func TestReleaseWhileBreakerOpen(t *testing.T) {
	h := concurrencyHandler(t, []string{redistest.StandaloneAddr(t)}, 5*time.Minute)
	end := hold(t, h, "k")
	if w := serve(h, keyRequest("k")); w.Code != http.StatusTooManyRequests {
		t.Fatalf("a second request in flight: status %d; want 429", w.Code)
	}
	b := h.store.Breaker("")
	for range redisstore.BreakerFailures {
		b.Failure(time.Now())
	}
	if !b.Open() {
		t.Fatal("breaker not open")
	}
	if code := end(); code != http.StatusOK {
		t.Fatalf("held request: status %d", code)
	}
	b.Success() // Redis answers again
	if w := serve(h, keyRequest("k")); w.Code != http.StatusOK {
		t.Fatalf("after the only request ended during the cooldown: status %d; want 200 (its slot given back)", w.Code)
	}
}

// TestLeaseRenewed: a request that outlives its lease keeps its slot in
// Redis, as in memory: the limit holds for long streams.
func TestLeaseRenewed(t *testing.T) {
	stores := map[string][]string{"standalone": {redistest.StandaloneAddr(t)}, "cluster": redistest.ClusterAddrs(t)}
	for name, addrs := range stores {
		t.Run(name, func(t *testing.T) {
			h := concurrencyHandler(t, addrs, time.Second)
			end := hold(t, h, "stream")
			time.Sleep(2500 * time.Millisecond) // two and a half leases
			if w := serve(h, keyRequest("stream")); w.Code != http.StatusTooManyRequests {
				t.Fatalf("while a request older than its lease is in flight: status %d; want 429", w.Code)
			}
			if code := end(); code != http.StatusOK {
				t.Fatalf("held request: status %d", code)
			}
			if w := serve(h, keyRequest("stream")); w.Code != http.StatusOK {
				t.Fatalf("after the stream ended: status %d; want 200", w.Code)
			}
		})
	}
}

func caddyDuration(d time.Duration) caddy.Duration { return caddy.Duration(d) }

// TestRefusedRenewsNoLeases: with Redis, a refused request renews no
// lease: before, each refusal left a goroutine renewing, for ever, the
// leases of slots it never took.
func TestRefusedRenewsNoLeases(t *testing.T) {
	h := concurrencyHandler(t, []string{redistest.StandaloneAddr(t)}, 5*time.Minute)
	end := hold(t, h, "k")
	before := runtime.NumGoroutine()
	for range 20 {
		if w := serve(h, keyRequest("k")); w.Code != http.StatusTooManyRequests {
			t.Fatalf("status %d while the slot is held; want 429", w.Code)
		}
	}
	if n := runtime.NumGoroutine(); n > before+5 {
		t.Fatalf("%d goroutines after 20 refusals, %d before", n, before)
	}
	if code := end(); code != http.StatusOK {
		t.Fatalf("held request: status %d", code)
	}
}

// TestReleaseRetriesPerNode: the releases that a node did not take are
// tried again as soon as that node answers, even while releases bound for
// a node that still does not answer wait too: one dead shard does not hold
// back the slots of the others.
func TestReleaseRetriesPerNode(t *testing.T) {
	c := redistest.NewClusterOf(t, 3, 0)
	h := concurrencyHandler(t, c.Addrs(), 5*time.Minute)
	byNode := map[string][]string{} // client keys by the master that holds their slots
	dead := h.store.Node(t.Context(), h.zones[0].bucket("k0"))
	for i := 0; len(byNode) < 3 || len(byNode[dead]) < 4; i++ {
		key := fmt.Sprint("k", i)
		node := h.store.Node(t.Context(), h.zones[0].bucket(key))
		byNode[node] = append(byNode[node], key)
	}
	var back string // a node that comes back
	for node := range byNode {
		if node != dead {
			back = node
		}
	}
	deadKeys, backKey := byNode[dead][:4], byNode[back][0]
	var ends []func() int
	for _, key := range append(deadKeys, backKey) {
		ends = append(ends, hold(t, h, key))
	}
	c.Server(dead).Pause() // its releases time out
	t.Cleanup(c.Server(dead).Resume)
	unbusy := busy(t, back) // its releases are refused (BUSY), not run later
	endAll(t, ends[:4])     // their releases fail, and are tried again
	endAll(t, ends[4:])     // after them
	unbusy()
	resumed := time.Now()
	for time.Since(resumed) < 2500*time.Millisecond {
		if serve(h, keyRequest(backKey)).Code == http.StatusOK {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the slot of %s (node %s, back for %v) is still taken, while node %s does not answer",
		backKey, back, time.Since(resumed).Round(time.Millisecond), dead)
}

// busy keeps the Redis server at addr running a script, so that it
// answers every other command with BUSY (and runs none) until the
// returned function kills the script.
func busy(t *testing.T, addr string) (stop func()) {
	t.Helper()
	c := redistest.Dial(t, addr)
	if _, err := c.Do(t.Context(), "CONFIG", "SET", "busy-reply-threshold", "10"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = c.Do(context.Background(), "EVAL", "while true do end", 0)
	}()
	for _, err := c.Do(t.Context(), "PING"); err == nil || !strings.HasPrefix(err.Error(), "BUSY"); _, err = c.Do(t.Context(), "PING") {
		time.Sleep(10 * time.Millisecond)
	}
	return func() {
		if _, err := c.Do(t.Context(), "SCRIPT", "KILL"); err != nil {
			t.Fatal(err)
		}
		<-done
	}
}

// endAll ends held requests at once, and waits for their ends.
func endAll(t *testing.T, ends []func() int) {
	t.Helper()
	codes := make(chan int, len(ends))
	for _, end := range ends {
		go func() { codes <- end() }()
	}
	for range ends {
		if code := <-codes; code != http.StatusOK {
			t.Fatalf("held request: status %d", code)
		}
	}
}
