package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestProvisionRedisErrors(t *testing.T) {
	zones := map[string]*Zone{"a": {Key: "k", Rate: "1r/s"}}
	cases := map[string]struct {
		h    Handler
		want string
	}{
		"on_store_error without redis": {Handler{OnStoreError: &StoreErrorPolicy{Mode: "deny"}}, "on_store_error applies only with redis"},
		"no addresses":                 {Handler{Redis: &RedisConfig{}}, "redis: addresses: at least one host:port"},
		"empty address":                {Handler{Redis: &RedisConfig{Addresses: []string{"{env.RL_TEST_UNSET}"}}}, "none empty"},
		"negative timeout":             {Handler{Redis: &RedisConfig{Addresses: []string{"a:1"}, Timeout: -1}}, "timeout -1ns: must be positive"},
		"db in cluster":                {Handler{Redis: &RedisConfig{Addresses: []string{"a:1", "b:1"}, DB: 2}}, "Redis Cluster has only db 0"},
		"prefix with tag":              {Handler{Redis: &RedisConfig{Addresses: []string{"a:1"}, KeyPrefix: "a{b}"}}, "must not contain { or }"},
		"unknown mode":                 {Handler{Redis: &RedisConfig{Addresses: []string{"a:1"}}, OnStoreError: &StoreErrorPolicy{Mode: "open"}}, `unknown mode "open"`},
		"bad status":                   {Handler{Redis: &RedisConfig{Addresses: []string{"a:1"}}, OnStoreError: &StoreErrorPolicy{Mode: "deny", Status: 302}}, "status 302 is not an error status"},
		"tls missing ca":               {Handler{Redis: &RedisConfig{Addresses: []string{"a:1"}, TLS: &RedisTLS{CA: "/nonexistent.pem"}}}, "redis: tls: reading ca"},
		"tls cert without key":         {Handler{Redis: &RedisConfig{Addresses: []string{"a:1"}, TLS: &RedisTLS{Cert: "c.pem"}}}, "cert and key go together"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			h := c.h
			h.Zones = zones
			err := provision(t, &h)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v; want it to contain %q", err, c.want)
			}
		})
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
