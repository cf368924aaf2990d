package ratelimit

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// TestSyncNeedsRedis: a zone that syncs without a redis block fails to
// load, saying why.
func TestSyncNeedsRedis(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"s": {Key: "{http.request.header.X-Key}", Rate: "5r/m", Sync: caddy.Duration(100 * time.Millisecond)}}}
	err := provision(t, h)
	if err == nil || !strings.Contains(err.Error(), "needs a redis block") {
		t.Fatalf("provision = %v, want an error that sync needs a redis block", err)
	}
}

// TestSyncZoneDecides: one instance syncing a zone of 5r/m (a token
// bucket, a fixed window, a sliding window counter) admits 5 from its
// allowance, with the headers counting down, refuses the 6th with a
// Retry-After, and charges Redis what it admitted at its next round (the
// admin lookup, which reads Redis, then shows none left).
func TestSyncZoneDecides(t *testing.T) {
	for _, algo := range []string{"", "fixed_window", "sliding_window_counter"} {
		t.Run(cmp.Or(algo, "token_bucket"), func(t *testing.T) { testSyncZoneDecides(t, algo) })
	}
}

func testSyncZoneDecides(t *testing.T, algo string) {
	name := fmt.Sprintf("sync_%x", rand.Uint64())
	h := &Handler{Zones: map[string]*Zone{name: {Key: "{http.request.header.X-Key}", Rate: "5r/m", Algorithm: algo, Sync: caddy.Duration(100 * time.Millisecond)}},
		Redis: &RedisConfig{Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("sy%x:", rand.Uint64())}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		w := serve(h, keyRequest("k"))
		if w.Code != http.StatusOK || w.Header().Get("X-Ratelimit-Remaining") != fmt.Sprint(4-i) || w.Header().Get("X-Ratelimit-Limit") != "5" {
			t.Fatalf("request %d: %d, limit %q, remaining %q", i+1, w.Code, w.Header().Get("X-Ratelimit-Limit"), w.Header().Get("X-Ratelimit-Remaining"))
		}
	}
	w := serve(h, keyRequest("k"))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("the 6th: %d, Retry-After %q; want 429 with one", w.Code, w.Header().Get("Retry-After"))
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		status, out := adminCall(t, http.MethodPost, "/rate_limit/zones/"+name+"/lookup", `{"key":"k"}`)
		if status == http.StatusOK && strings.Contains(out, `"remaining":0`) && strings.Contains(out, `"sync":"100ms"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis never showed the admissions charged: %d %s", status, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSyncFailureSays: the warning of failing rounds says what failed: an
// error Redis answered with (its code), a time-out, or no answer; never
// "cannot reach Redis" when Redis answered.
func TestSyncFailureSays(t *testing.T) {
	c := redistest.Dial(t, redistest.StandaloneAddr(t))
	ctx := context.Background()
	_, crossslot := c.Do(ctx, "EVAL", "return redis.error_reply('CROSSSLOT Keys in request do not hash to the same slot')", 0)
	short, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-short.Done()
	_, timeout := c.Do(short, "PING")
	_, refused := redistest.Dial(t, "127.0.0.1:1").Do(ctx, "PING")
	l, err := limiter.New(limiter.Config{Redis: &limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: "says:"}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s := newSharedLimiter("")
	s.Limiter = l
	for err, want := range map[error]string{
		crossslot:              "Redis answered with the error CROSSSLOT",
		timeout:                "Redis did not answer within the timeout",
		refused:                "cannot reach Redis",
		limiter.ErrBreakerOpen: "the circuit breaker skips Redis",
	} {
		if got := s.syncFailure(err); !strings.HasPrefix(got, want) {
			t.Errorf("round failing with %v: says %q, want %q", err, got, want)
		}
	}
}

// TestSyncRegistersAtFirstRequest: a config with a zone that syncs
// registers nothing as it loads (caddy validate loads one), and logs the
// bound of at least on_store_error local's instances; its first request
// registers the instance; and when the instances counted change, the
// bound is logged again with the new count.
func TestSyncRegistersAtFirstRequest(t *testing.T) {
	addr := redistest.StandaloneAddr(t)
	c := redistest.Dial(t, addr)
	prefix := fmt.Sprintf("reg%x:", rand.Uint64())
	core, logs := observer.New(zap.InfoLevel)
	h := &Handler{Zones: map[string]*Zone{"api": {Key: "{http.request.header.X-Key}", Rate: "100r/s", Sync: caddy.Duration(100 * time.Millisecond)}},
		Redis: &RedisConfig{Addresses: []string{addr}, KeyPrefix: prefix}, OnStoreError: &StoreErrorPolicy{Mode: "local", Instances: 3}}
	h.logger = zap.New(core)
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	key := prefix + "{sync}:instances"
	if n := c.Int(context.Background(), "ZCARD", key); n != 0 {
		t.Fatalf("%d instances registered by a config that only loaded", n)
	}
	bounds := func(instances int) int {
		return logs.FilterMessageSnippet("zone syncs").FilterField(zap.Int("instances", instances)).Len()
	}
	if bounds(3) != 1 {
		t.Fatalf("the bound as the config loads is not logged for on_store_error local's 3 instances: %v", logs.All())
	}
	serve(h, keyRequest("k"))
	waitFor(t, "the first request registers the instance", func() bool { return c.Int(context.Background(), "ZCARD", key) == 1 })
	now, _ := c.Do(context.Background(), "TIME") // seconds and microseconds
	at := now.([]any)
	sec, _ := strconv.ParseInt(at[0].(string), 10, 64)
	usec, _ := strconv.ParseInt(at[1].(string), 10, 64)
	for i := range 3 {
		_, _ = c.Do(context.Background(), "ZADD", key, sec*1000+usec/1000, fmt.Sprint("other", i))
	}
	waitFor(t, "the bound logged again for 4 instances", func() bool { return bounds(4) == 1 })
}

// waitFor waits up to 5 seconds for ok, failing with what it waited for.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
	}
}
