package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// provision provisions h as Caddy would, releasing it when the test ends.
func provision(t testing.TB, h *Handler) error {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(func() { h.Cleanup(); cancel() })
	if err := h.Provision(ctx); err != nil {
		return err
	}
	return h.Validate()
}

func TestProvisionErrors(t *testing.T) {
	cases := map[string]struct {
		zones map[string]*Zone
		want  string
	}{
		"no zones":       {nil, "no zones"},
		"nil zone":       {map[string]*Zone{"a": nil}, `zone "a": empty zone`},
		"empty name":     {map[string]*Zone{"": {Key: "k", Rate: "1r/s"}}, "zone has no name"},
		"no key":         {map[string]*Zone{"a": {Rate: "1r/s"}}, `zone "a": key is required`},
		"no rate":        {map[string]*Zone{"a": {Key: "k"}}, `zone "a": rate (or max_concurrent) is required`},
		"bad rate":       {map[string]*Zone{"a": {Key: "k", Rate: "1/s"}}, `zone "a": rate "1/s"`},
		"negative burst": {map[string]*Zone{"a": {Key: "k", Rate: "1r/s", Burst: "-1"}}, `zone "a": burst "-1": want a whole number of at least 1`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			err := provision(t, &Handler{Zones: c.zones})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v; want it to contain %q", err, c.want)
			}
		})
	}
}

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

// serve runs one request through h and returns the recorder.
func serve(h *Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r = r.Clone(r.Context())
	caddyhttp.NewTestReplacer(r) // the request placeholders, as Caddy's server sets them
	ok := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusOK)
		return nil
	})
	if err := h.ServeHTTP(w, r, ok); err != nil {
		w.Code = http.StatusInternalServerError
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			w.Code = he.StatusCode
		}
	}
	return w
}

func BenchmarkServeHTTP(b *testing.B) {
	for _, zones := range []int{1, 3} {
		b.Run(map[int]string{1: "one_zone", 3: "three_zones"}[zones], func(b *testing.B) {
			h := &Handler{Zones: map[string]*Zone{}}
			for i := range zones {
				h.Zones[string(rune('a'+i))] = &Zone{Key: "{http.request.header.X-Key}", Rate: "1000000r/s"}
			}
			if err := provision(b, h); err != nil {
				b.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("X-Key", "client-1")
			b.ReportAllocs()
			for b.Loop() {
				if w := serve(h, r); w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}

// caddyhttpTestReplacer is the request's replacer with {http.vars.*} set.
func caddyhttpTestReplacer(r *http.Request, vars map[string]string) *caddy.Replacer {
	ctx := context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{})
	*r = *r.WithContext(ctx)
	repl := caddyhttp.NewTestReplacer(r)
	for k, v := range vars {
		caddyhttp.SetVar(r.Context(), k, v)
	}
	return repl
}

func testLogger(t testing.TB) *zap.Logger { return zap.NewNop() }
