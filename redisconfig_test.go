package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
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

// tlsTestTimeout is the TLS tests' decision timeout (see TestRedisTLS).
const tlsTestTimeout = caddy.Duration(5 * time.Second)

func TestRedisTLS(t *testing.T) {
	_, addr, files := redistest.NewTLSServer(t)
	// A timeout of seconds, not the default 100 ms: these tests are of TLS,
	// and a loaded machine may take longer than that for the first
	// decision's handshake and script load.
	h := redisHandler(t, &RedisConfig{Addresses: []string{addr}, Timeout: tlsTestTimeout,
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

// TestRedisTLSRotation: certificates replaced on disk take effect on the
// next provisioning of the same configuration (a caddy reload): the new
// handler gets a pool of its own, built from the new files, and the old
// pool goes when the old handler is cleaned up. Here the CA, the
// certificate and the key all change, and the server restarts with them,
// so that only the new files are accepted.
func TestRedisTLSRotation(t *testing.T) {
	s, addr, files := redistest.NewTLSServer(t)
	prefix := fmt.Sprintf("rot%x:", rand.Uint64())
	handler := func() *Handler { // the same configuration every time
		h := &Handler{
			Zones: map[string]*Zone{"api": {Key: "{http.request.header.X-Key}", Rate: "1r/m", Burst: "5"}},
			Redis: &RedisConfig{Addresses: []string{addr}, KeyPrefix: prefix, Timeout: tlsTestTimeout,
				TLS: &RedisTLS{CA: files.CA, Cert: files.Cert, Key: files.Key}},
			OnStoreError: &StoreErrorPolicy{Mode: "deny"},
		}
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	expect := func(h *Handler, when, remaining string) {
		t.Helper()
		if w := serve(h, keyRequest("k")); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != remaining {
			t.Fatalf("%s: status %d, remaining %q; want 200, %s", when, w.Code, w.Header().Get("X-RateLimit-Remaining"), remaining)
		}
	}
	old := handler()
	expect(old, "before the rotation", "4")

	if _, err := redistest.WriteTLSFiles(filepath.Dir(files.CA)); err != nil { // same paths, new CA, cert and key
		t.Fatal(err)
	}
	s.Stop()
	if err := s.Start(); err != nil { // with the new files; its data is gone
		t.Fatal(err)
	}
	reloaded := handler()
	oldKey := old.poolKey
	if reloaded.poolKey == oldKey || reloaded.store == old.store {
		t.Error("the handler provisioned after the rotation shares the pool built from the old files")
	}
	expect(reloaded, "after the rotation", "4")
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if refs, ok := stores.References(oldKey); ok {
		t.Fatalf("the old pool still has %d references after its handler's Cleanup", refs)
	}
	expect(reloaded, "after the old handler's Cleanup", "3")
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
	c := redistest.Dial(t, master.Addr)
	if n, err := c.Do(context.Background(), "DBSIZE"); err != nil || n != int64(1) {
		t.Fatalf("master holds %d keys (%v); want the one bucket", n, err)
	}
}

// TestPoolKeyFollowsTLSFiles: the pool key changes with the contents of
// each TLS file (a CA bundle renewed alone, a certificate and its key),
// not only with their paths, and is the same for the same contents.
func TestPoolKeyFollowsTLSFiles(t *testing.T) {
	dir, next := t.TempDir(), t.TempDir()
	files, err := redistest.WriteTLSFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := redistest.WriteTLSFiles(next)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &RedisConfig{Addresses: []string{"a:1"}, Password: "secret", TLS: &RedisTLS{CA: files.CA, Cert: files.Cert, Key: files.Key}}
	key := func() string {
		t.Helper()
		f, err := cfg.TLS.read()
		if err != nil {
			t.Fatal(err)
		}
		k, err := cfg.poolKey(f)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	copyFile := func(from, to string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(to, b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	first := key()
	if key() != first || strings.Contains(first, "secret") {
		t.Fatalf("pool key %q: not stable, or shows the password", first)
	}
	copyFile(renewed.CA, files.CA)
	afterCA := key()
	copyFile(renewed.Cert, files.Cert)
	copyFile(renewed.Key, files.Key)
	if afterCert := key(); afterCA == first || afterCert == afterCA {
		t.Fatalf("pool keys %s, then %s (new CA), then %s (new cert and key); want three", first, afterCA, afterCert)
	}
}

// TestKeySecret: with key_secret, a client's buckets are named by a keyed
// digest, not by the SHA-256 that anyone can compute (which would let
// clients choose keys that all land on one shard); instances that share
// the secret share the buckets, and another secret names other buckets.
func TestKeySecret(t *testing.T) {
	addr := redistest.StandaloneAddr(t)
	prefix := fmt.Sprintf("ks%x:", rand.Uint64())
	secret := strings.Repeat("s", 16)
	gateway := func(secret string) *Handler {
		h := &Handler{
			Zones:        map[string]*Zone{"api": {Key: "{http.request.header.X-Key}", Rate: "1r/m", Burst: "2"}},
			Redis:        &RedisConfig{Addresses: []string{addr}, KeyPrefix: prefix, KeySecret: secret},
			OnStoreError: &StoreErrorPolicy{Mode: "deny"},
		}
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	a, b, other := gateway(secret), gateway(secret), gateway(strings.Repeat("o", 16))
	for i, h := range []*Handler{a, b, a} {
		want := []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests}[i]
		if w := serve(h, keyRequest("client")); w.Code != want {
			t.Fatalf("request %d through the gateways that share the secret: status %d; want %d", i+1, w.Code, want)
		}
	}
	if w := serve(other, keyRequest("client")); w.Code != http.StatusOK {
		t.Fatalf("through a gateway with another secret: status %d; want 200 (its own bucket)", w.Code)
	}
	c := redistest.Dial(t, addr)
	keyed := redisstore.RedisKey(prefix, "api", bucket.NewKeyHasher(secret).Sum("client"))
	plain := redisstore.RedisKey(prefix, "api", bucket.KeyHash("client"))
	if n, err := c.Do(t.Context(), "EXISTS", keyed, plain); err != nil || n != int64(1) || c.Int(t.Context(), "EXISTS", plain) != 0 {
		t.Fatalf("keys in Redis: %d of %s (keyed) and %s (SHA-256 alone), %v; want the keyed one alone", n, keyed, plain, err)
	}
}

func TestKeySecretErrors(t *testing.T) {
	t.Setenv("RL_TEST_SHORT_SECRET", "short")
	for secret, want := range map[string]string{
		"short":                        "key_secret: at least 16 characters, not 5",
		"{env.RL_TEST_SHORT_SECRET}":   "key_secret: at least 16 characters, not 5",
		"{env.RL_TEST_UNSET_SECRET_X}": `key_secret "{env.RL_TEST_UNSET_SECRET_X}"`,
		"{$RL_KEY_SECRET_IN_JSON}":     `key_secret "{$RL_KEY_SECRET_IN_JSON}"`, // the Caddyfile's syntax, not expanded in JSON
		"{env_RL_KEY_SECRET_TYPO}":     `key_secret "{env_RL_KEY_SECRET_TYPO}"`,
	} {
		h := &Handler{Zones: map[string]*Zone{"api": {Key: "k", Rate: "1r/m"}},
			Redis: &RedisConfig{Addresses: []string{"127.0.0.1:1"}, KeySecret: secret}}
		if err := provision(t, h); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("key_secret %q: error %v; want it to contain %q", secret, err, want)
		}
	}
}

// TestEmptySecrets: a secret or password that a placeholder leaves empty
// is an error, at adapt ({$VAR}, replaced when the Caddyfile is read) or
// at load ({env.VAR}); it never leaves the config without one.
func TestEmptySecrets(t *testing.T) {
	for _, option := range []string{"key_secret", "password", "username"} {
		_, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tredis {\n\t\t\taddresses 127.0.0.1:6379\n\t\t\t"+option+
			" \"{$RL_TEST_UNSET_SECRET}\"\n\t\t}\n\t\tzone a {\n\t\t\trate 1r/s\n\t\t}\n\t}\n}\n")
		if err == nil || !strings.Contains(err.Error(), option+" is empty") || !strings.Contains(err.Error(), "Caddyfile:5") {
			t.Errorf("%s {$UNSET}: adapt error %v; want %q with its line", option, err, option+" is empty")
		}
	}
	for _, option := range []string{"password", "username"} {
		c := &RedisConfig{Addresses: []string{"127.0.0.1:1"}}
		*map[string]*string{"password": &c.Password, "username": &c.Username}[option] = "{env.RL_TEST_UNSET_SECRET}"
		if _, err := c.resolve(); err == nil || !strings.Contains(err.Error(), "resolves to nothing") {
			t.Errorf("%s {env.UNSET}: %v; want an error", option, err)
		}
	}
}

// TestStoreFailuresNamed: the first failure says what failed: a refused
// connection as such (not as a timeout of dials tried again), and a
// Redis that refuses the password as refusing the credentials, at start
// and at the first request.
func TestStoreFailuresNamed(t *testing.T) {
	srv := redistest.NewServer(t)
	admin := redistest.Dial(t, srv.Addr)
	if _, err := admin.Do(t.Context(), "CONFIG", "SET", "requirepass", "right-password"); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		cfg  RedisConfig
		want []string
	}{
		"refused":        {RedisConfig{Addresses: []string{"127.0.0.1:1"}}, []string{"not reachable at start", "connection refused"}},
		"wrong password": {RedisConfig{Addresses: []string{srv.Addr}, Password: "wrong"}, []string{"refuses the credentials at start", "WRONGPASS"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			c.cfg.KeyPrefix = fmt.Sprintf("named%x:", rand.Uint64())
			h := &Handler{Zones: map[string]*Zone{"api": {Key: "{http.request.header.X-Key}", Rate: "1r/m"}},
				Redis: &c.cfg, OnStoreError: &StoreErrorPolicy{Mode: "deny"}}
			h.logger = zap.New(core) // Provision keeps a logger a test set
			if err := provision(t, h); err != nil {
				t.Fatal(err)
			}
			serve(h, keyRequest("k"))
			all := fmt.Sprint(logs.All())
			for _, w := range c.want {
				if !strings.Contains(all, w) {
					t.Errorf("logs %s; want %q", all, w)
				}
			}
		})
	}
}

// TestRedisConnectingCountsNoError: the store's connections are made
// without a command that Redis before 7.2 answers with an error (the Redis
// client's CLIENT SETINFO): a Redis's errorstats, which an operator may alert on,
// count no error but NOSCRIPT, once per script a node has not cached.
func TestRedisConnectingCountsNoError(t *testing.T) {
	srv := redistest.NewServer(t)
	c := redistest.Dial(t, srv.Addr)
	errors := func() string { // without NOSCRIPT
		var lines []string
		for _, l := range strings.Split(c.Text(context.Background(), "INFO", "errorstats"), "\n") {
			if strings.HasPrefix(l, "errorstat_") && !strings.HasPrefix(l, "errorstat_NOSCRIPT") {
				lines = append(lines, strings.TrimSpace(l))
			}
		}
		return strings.Join(lines, " ")
	}
	before := errors() // the test's own connections' (redistest's)
	h := &Handler{Zones: map[string]*Zone{"api": {Key: "{http.request.header.X-Key}", Rate: "100r/s"}},
		Redis: &RedisConfig{Addresses: []string{srv.Addr}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		serve(h, keyRequest(fmt.Sprint("k", i)))
	}
	if after := errors(); after != before {
		t.Fatalf("Redis counted errors of a limiter that only connected and decided: %q, before it %q", after, before)
	}
}
