package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// TestQuotaTwoCaddysOneRedis: quota 3 per day in Pacific/Auckland,
// through two Caddys on one Redis: a key's 3 requests pass, whichever
// Caddy they go through, and the 4th is refused until the next midnight
// in Auckland, as Retry-After, X-RateLimit-Reset and the body say; the
// admin lookup on either Caddy says 3 used; the counter in Redis expires
// at that midnight.
func TestQuotaTwoCaddysOneRedis(t *testing.T) {
	addr := redistest.StandaloneAddr(t)
	prefix := fmt.Sprintf("quota%d:", time.Now().UnixNano())
	site := "\trate_limit {\n" + redisBlock(prefix, addr) + `
		zone daily {
			key {http.request.header.X-API-Key}
			quota 3 per day
			time_zone Pacific/Auckland
		}
	}
	respond "ok"
`
	caddys := []*testcaddy.Caddy{testcaddy.Start(t, site), testcaddy.Start(t, site)}
	akl, _ := time.LoadLocation("Pacific/Auckland")
	y, m, d := time.Now().In(akl).Date()
	midnight := time.Date(y, m, d+1, 0, 0, 0, 0, akl)
	if time.Until(midnight) < time.Minute {
		t.Skip("too near midnight in Auckland")
	}
	for i := range 3 {
		resp, body, err := caddys[i%2].Get("/", "X-API-Key", "customer-1")
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(2-i) {
			t.Fatalf("request %d: %v %v %s", i, err, resp, body)
		}
	}
	resp, body, err := caddys[1].Get("/", "X-API-Key", "customer-1")
	if err != nil || resp.StatusCode != 429 {
		t.Fatalf("4th: %v %v %s", err, resp, body)
	}
	wait := time.Until(midnight).Seconds()
	retry, _ := strconv.ParseFloat(resp.Header.Get("Retry-After"), 64)
	reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
	if math.Abs(retry-wait) > 5 || reset != midnight.Unix() {
		t.Fatalf("Retry-After %s, X-RateLimit-Reset %d; want %.0f s, until %d (the next midnight in Auckland)",
			resp.Header.Get("Retry-After"), reset, wait, midnight.Unix())
	}
	var refusal map[string]any
	if err := json.Unmarshal([]byte(body), &refusal); err != nil || refusal["resets_at"] != midnight.Format(time.RFC3339) {
		t.Fatalf("body %s: want resets_at %s", body, midnight.Format(time.RFC3339))
	}
	if resp, _, _ := caddys[0].Get("/", "X-API-Key", "customer-2"); resp.StatusCode != 200 {
		t.Fatalf("another key: %d", resp.StatusCode)
	}
	for i, c := range caddys {
		status, u, body := adminBody(t, c, "POST", "/rate_limit/zones/daily/lookup", `{"key":"customer-1"}`)
		if status != 200 || u["used"] != 3.0 || u["remaining"] != 0.0 || u["resets_at"] != midnight.Format(time.RFC3339) {
			t.Fatalf("lookup on Caddy %d: %d %s", i, status, body)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	key := redisstore.RedisKey(prefix, "daily", bucket.KeyHash("customer-1")) + ":u"
	ttl, err := rdb.PTTL(context.Background(), key).Result()
	if err != nil || math.Abs(ttl.Seconds()-time.Until(midnight).Seconds()) > 5 {
		t.Fatalf("TTL of %s: %s, %v; want until midnight in Auckland, %s", key, ttl, err, time.Until(midnight))
	}
}
