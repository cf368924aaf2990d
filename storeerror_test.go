package ratelimit

import (
	"net/http"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// TestScriptErrorsStayWithTheirClient: a client whose requests make the
// script fail (here its bucket's key holds another type) gets
// on_store_error for its own requests, and cannot open the breaker for
// everyone: another client is decided by Redis all along.
func TestScriptErrorsStayWithTheirClient(t *testing.T) {
	addr := redistest.StandaloneAddr(t)
	h := redisHandler(t, &RedisConfig{Addresses: []string{addr}}) // deny on store errors
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	key := limiter.RedisKey(h.Redis.KeyPrefix, "api", limiter.KeyHash("evil"))
	if err := c.HSet(t.Context(), key, "not", "a bucket").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if w := serve(h, keyRequest("evil")); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("evil request %d: status %d; want 503 (on_store_error deny, for it alone)", i, w.Code)
		}
	}
	for _, want := range []string{"4", "3"} {
		w := serve(h, keyRequest("good"))
		if w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Remaining") != want {
			t.Fatalf("another client after the script errors: status %d, remaining %q; want 200, %s (a Redis decision)",
				w.Code, w.Header().Get("X-RateLimit-Remaining"), want)
		}
	}
}
