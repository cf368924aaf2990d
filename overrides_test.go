package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// adminCall sends a request to the admin API's handler and returns the
// status and the body.
func adminCall(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	w := httptest.NewRecorder()
	if err := serveAdmin(w, r); err != nil {
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) {
			t.Fatalf("%s %s: not an API error: %v", method, path, err)
		}
		return apiErr.HTTPStatus, apiErr.Err.Error()
	}
	return w.Code, w.Body.String()
}

// overrideZone provisions a handler with one zone of a name of its own,
// keyed by X-Key, and removes its overrides when the test ends.
func overrideZone(t *testing.T, zone *Zone, redis *RedisConfig) (*Handler, string) {
	t.Helper()
	name := fmt.Sprintf("ovr_%x", rand.Uint64())
	zone.Key = "{http.request.header.X-Key}"
	h := &Handler{Zones: map[string]*Zone{name: zone}, Redis: redis}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, e := range h.store.overrides.Current().Entries(time.Now()) {
			if e.Zone == name {
				body := ""
				path := "/rate_limit/overrides/" + name
				if e.Digest != "" {
					path, body = path+"/key", `{"key_digest":"`+e.Digest+`"}`
				}
				adminCall(t, http.MethodDelete, path, body)
			}
		}
	})
	return h, name
}

// passes sends n requests of key and counts those that pass.
func passes(h *Handler, key string, n int) int {
	ok := 0
	for range n {
		if serve(h, keyRequest(key)).Code == http.StatusOK {
			ok++
		}
	}
	return ok
}

func mustAdmin(t *testing.T, method, path, body string) string {
	t.Helper()
	status, out := adminCall(t, method, path, body)
	if status != http.StatusOK {
		t.Fatalf("%s %s %s: %d %s", method, path, body, status, out)
	}
	return out
}

// TestOverridesChangeDecisions: every kind of override, set and deleted
// through the admin API, changes the decisions of the next request.
func TestOverridesChangeDecisions(t *testing.T) {
	h, zone := overrideZone(t, &Zone{Rate: "5r/m"}, nil)
	base := "/rate_limit/overrides/" + zone
	if n := passes(h, "a", 7); n != 5 {
		t.Fatalf("key a: %d passed, want the config's 5", n)
	}
	mustAdmin(t, "PUT", base+"/key", `{"key":"b","rate":"100r/m","burst":100}`)
	if n := passes(h, "b", 120); n != 100 {
		t.Fatalf("key b with its override: %d passed, want 100", n)
	}
	if got := serve(h, keyRequest("b")).Header().Get("X-Ratelimit-Limit"); got != "100" {
		t.Fatalf("key b's X-RateLimit-Limit = %q, want the override's 100", got)
	}
	mustAdmin(t, "PUT", base, `{"rate":"2r/m","expires_in":"1h"}`)
	if n := passes(h, "c", 5); n != 2 {
		t.Fatalf("key c under the zone's override: %d passed, want 2", n)
	}
	mustAdmin(t, "PUT", base+"/key", `{"key":"d","block":true,"expires_in":"30s"}`)
	w := serve(h, keyRequest("d"))
	if ra, _ := strconv.Atoi(w.Header().Get("Retry-After")); w.Code != http.StatusTooManyRequests || ra < 29 || ra > 30 {
		t.Fatalf("blocked key d: %d, Retry-After %q, want 429 and 30", w.Code, w.Header().Get("Retry-After"))
	}
	mustAdmin(t, "PUT", base+"/key", `{"key":"e","exempt":true}`)
	if n := passes(h, "e", 20); n != 20 {
		t.Fatalf("exempt key e: %d of 20 passed", n)
	}
	mustAdmin(t, "PUT", base, `{"dry_run":true}`)
	if n := passes(h, "a", 3); n != 3 {
		t.Fatalf("key a, the zone in dry run: %d of 3 passed", n)
	}
	mustAdmin(t, "PUT", base, `{"disabled":true}`)
	w = serve(h, keyRequest("a"))
	if w.Code != http.StatusOK || w.Header().Get("X-Ratelimit-Limit") != "" {
		t.Fatalf("key a, the zone disabled: %d, headers %v", w.Code, w.Header())
	}
	mustAdmin(t, "DELETE", base, "")
	if n := passes(h, "f", 7); n != 5 {
		t.Fatalf("key f after the zone's override was deleted: %d passed, want 5", n)
	}
	mustAdmin(t, "DELETE", base+"/key", `{"key":"b"}`)
	if n := passes(h, "b", 3); n != 0 {
		t.Fatalf("key b after its override was deleted: %d passed, want none (its bucket, at 5, is spent)", n)
	}
}

// TestOverridesListing: GET lists the overrides in force, a key as its
// digest; the raw key appears nowhere in the answers.
func TestOverridesListing(t *testing.T) {
	_, zone := overrideZone(t, &Zone{Rate: "5r/m"}, nil)
	secret := "sk_live_very_secret"
	out := mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"`+secret+`","rate":"50r/m","expires_in":"2h"}`)
	list := mustAdmin(t, "GET", "/rate_limit/overrides", "")
	if strings.Contains(out+list, secret) {
		t.Fatalf("an answer shows the raw key:\n%s\n%s", out, list)
	}
	var stores []overrideListing
	if err := json.Unmarshal([]byte(list), &stores); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range stores {
		for _, o := range s.Overrides {
			if o.Zone == zone {
				found = o.KeyDigest != "" && o.Rate == "50r/m" && o.ExpiresAt != "" && o.Kind == "limit" && o.By != ""
			}
		}
	}
	if !found {
		t.Fatalf("the override is not listed as set: %s", list)
	}
}

// TestOverrideAdminErrors: malformed or inapplicable input is a 400 (an
// unknown zone a 404) with a message that says what is wrong, and
// nothing is stored.
func TestOverrideAdminErrors(t *testing.T) {
	_, zone := overrideZone(t, &Zone{Rate: "5r/m"}, nil)
	_, window := overrideZone(t, &Zone{Rate: "5r/m", Algorithm: "fixed_window"}, nil)
	_, conc := overrideZone(t, &Zone{MaxConcurrent: 3}, nil)
	base := "/rate_limit/overrides/"
	for _, c := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"PUT", base + zone, `{"rate":"10r/x"}`, 400, "rate: "},
		{"PUT", base + zone, `{"rate":"4r/min"}`, 400, "write 4r/m"},
		{"PUT", base + zone, `{"burst":-1}`, 400, "burst -1"},
		{"PUT", base + zone, `{"burst":0}`, 400, "burst 0"},
		{"PUT", base + zone, `{"rate":"1r/s","expires_at":"2001-01-01T00:00:00Z"}`, 400, "in the past"},
		{"PUT", base + zone, `{"rate":"1r/s","expires_in":"-5m"}`, 400, "expires_in"},
		{"PUT", base + zone, `{"rate":"1r/s","expires_in":"1h","expires_at":"2099-01-01T00:00:00Z"}`, 400, "not both"},
		{"PUT", base + zone, `{}`, 400, "nothing to override"},
		{"PUT", base + zone, `{"rate":"1r/s","colour":"red"}`, 400, `unknown field "colour"`},
		{"PUT", base + zone, `{"rate":`, 400, "malformed JSON"},
		{"PUT", base + zone, `{"block":true}`, 400, "key's override"},
		{"PUT", base + zone, `{"key":"sk_secret_1","rate":"1r/s"}`, 400, "/key"},
		{"PUT", base + zone + "/key", `{"rate":"1r/s"}`, 400, `needs {"key"`},
		{"PUT", base + zone + "/key", `{"key":"sk_secret_1","disabled":true}`, 400, "zone's override"},
		{"PUT", base + zone + "/key", `{"key_digest":"00","rate":"1r/s"}`, 400, "32 hex digits"},
		{"PUT", base + window, `{"burst":5}`, 400, "burst does not apply to fixed_window"},
		{"PUT", base + conc, `{"rate":"1r/s"}`, 400, "max_concurrent zone"},
		{"PUT", base + zone, `{"max_concurrent":3}`, 400, "max_concurrent applies to max_concurrent zones"},
		{"PUT", base + zone, `{"rate":"1r/s","burst":2000000000000}`, 400, "burst"},
		{"PUT", base + "no_such_zone", `{"rate":"1r/s"}`, 404, "no zone"},
		{"POST", base + zone, `{"rate":"1r/s"}`, 405, "PUT or DELETE"},
		{"PUT", base + zone + "/keys", `{"rate":"1r/s"}`, 404, "want /rate_limit/overrides"},
		{"DELETE", base + zone, "", 404, "no such override"},
		{"PUT", base + zone + "/key", `{"key":"","exempt":true}`, 400, "empty key"},
		{"PUT", base + zone, `{"rate":"1r/s","store":"elsewhere"}`, 404, "no zone"},
		{"DELETE", base + zone + "/key", `{"key_digest":"xyz"}`, 400, "32 hex digits"},
		{"DELETE", base + zone + "/key", `{"key":"sk_secret_1","rate":"1r/s"}`, 400, "takes no fields"},
	} {
		status, out := adminCall(t, c.method, c.path, c.body)
		if status != c.status || !strings.Contains(out, c.want) {
			t.Errorf("%s %s %s: %d %q, want %d and %q", c.method, c.path, c.body, status, out, c.status, c.want)
		}
		if strings.Contains(out, "sk_secret_1") {
			t.Errorf("%s %s: the answer shows the key: %s", c.method, c.path, out)
		}
	}
	list := mustAdmin(t, "GET", "/rate_limit/overrides", "")
	for _, z := range []string{zone, window, conc} {
		if strings.Contains(list, z) {
			t.Fatalf("a refused change was stored: %s", list)
		}
	}
}

// TestOverrideLeftOutWhereItDoesNotFit: an override kept from a zone of
// another algorithm (the config changed, or another instance's zone of
// that name) does not change this zone's limit; a key's override that
// gives no valid limit with the zone's is refused.
func TestOverrideLeftOutWhereItDoesNotFit(t *testing.T) {
	name := fmt.Sprintf("ovr_fit_%x", rand.Uint64())
	conc := &Handler{Zones: map[string]*Zone{name: {Key: "{http.request.header.X-Key}", MaxConcurrent: 5}}}
	if err := provision(t, conc); err != nil {
		t.Fatal(err)
	}
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+name, `{"max_concurrent":1000}`)
	t.Cleanup(func() { adminCall(t, "DELETE", "/rate_limit/overrides/"+name, "") })
	conc.Cleanup()
	rated := &Handler{Zones: map[string]*Zone{name: {Key: "{http.request.header.X-Key}", Rate: "1r/m"}}}
	if err := provision(t, rated); err != nil {
		t.Fatal(err)
	}
	if n := passes(rated, "k", 5); n != 1 {
		t.Fatalf("a rate zone under a max_concurrent zone's override: %d of 5 passed, want its own 1", n)
	}

	h, leaky := overrideZone(t, &Zone{Rate: "1r/s", Algorithm: "leaky_bucket", Burst: "5"}, nil)
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+leaky, `{"rate":"1r/10s"}`)
	status, out := adminCall(t, "PUT", "/rate_limit/overrides/"+leaky+"/key", `{"key":"k","burst":120}`)
	if status != 400 || !strings.Contains(out, "with the zone's override") {
		t.Fatalf("a key's burst that the zone's override makes wait too long: %d %s, want 400", status, out)
	}
	_ = h
}

// TestOverrideStoreNamed: a zone name in two stores (a site on the memory
// store, another on Redis) takes a change only for the store named.
func TestOverrideStoreNamed(t *testing.T) {
	name := fmt.Sprintf("ovr_two_%x", rand.Uint64())
	mem := &Handler{Zones: map[string]*Zone{name: {Key: "{http.request.header.X-Key}", Rate: "2r/m"}}}
	red := &Handler{Zones: map[string]*Zone{name: {Key: "{http.request.header.X-Key}", Rate: "2r/m"}},
		Redis: &RedisConfig{Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("two%x:", rand.Uint64())}}
	for _, h := range []*Handler{mem, red} {
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
	}
	status, out := adminCall(t, "PUT", "/rate_limit/overrides/"+name, `{"disabled":true}`)
	if status != 409 || !strings.Contains(out, `"memory"`) {
		t.Fatalf("a zone in two stores, no store named: %d %s, want 409 naming them", status, out)
	}
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+name, `{"disabled":true,"store":"memory"}`)
	t.Cleanup(func() { adminCall(t, "DELETE", "/rate_limit/overrides/"+name, `{"store":"memory"}`) })
	if n := passes(mem, "k", 4); n != 4 {
		t.Fatalf("the memory store's zone, disabled: %d of 4 passed", n)
	}
	if n := passes(red, "k", 4); n != 2 {
		t.Fatalf("the Redis store's zone, not named: %d of 4 passed, want its 2", n)
	}
}

// TestOverrideOfAZoneGone: an override of a zone that the config no
// longer has can be deleted, by its digest for a key's.
func TestOverrideOfAZoneGone(t *testing.T) {
	name := fmt.Sprintf("ovr_gone_%x", rand.Uint64())
	h := &Handler{Zones: map[string]*Zone{name: {Key: "{http.request.header.X-Key}", Rate: "2r/m"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	keep := &Handler{Zones: map[string]*Zone{name + "_other": {Key: "{http.request.header.X-Key}", Rate: "2r/m"}}}
	if err := provision(t, keep); err != nil { // the memory store stays in use
		t.Fatal(err)
	}
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+name, `{"disabled":true}`)
	out := mustAdmin(t, "PUT", "/rate_limit/overrides/"+name+"/key", `{"key":"k","block":true}`)
	var set overrideOutput
	if err := json.Unmarshal([]byte(out), &set); err != nil {
		t.Fatal(err)
	}
	h.Cleanup()
	if status, out := adminCall(t, "DELETE", "/rate_limit/overrides/"+name+"/key", `{"key":"k"}`); status != 400 || !strings.Contains(out, "key_digest") {
		t.Fatalf("a key's delete by key, its zone gone: %d %s, want 400 asking for the digest", status, out)
	}
	mustAdmin(t, "DELETE", "/rate_limit/overrides/"+name+"/key", `{"key_digest":"`+set.KeyDigest+`"}`)
	mustAdmin(t, "DELETE", "/rate_limit/overrides/"+name, "")
	if list := mustAdmin(t, "GET", "/rate_limit/overrides", ""); strings.Contains(list, name+`"`) {
		t.Fatalf("the overrides of the zone gone are still listed: %s", list)
	}
}

// TestOverrideExpiryRestores: when an override expires, the config's
// limit applies again.
func TestOverrideExpiryRestores(t *testing.T) {
	h, zone := overrideZone(t, &Zone{Rate: "2r/h"}, nil)
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"x","rate":"10r/h","expires_in":"300ms"}`)
	if n := passes(h, "x", 5); n != 5 {
		t.Fatalf("with the override: %d of 5 passed", n)
	}
	time.Sleep(350 * time.Millisecond)
	// The bucket keeps its state: 5 of 10r/h spent is 30 minutes until
	// full, which the config's burst of 2 (an hour) caps at nothing: one
	// token is left.
	w := serve(h, keyRequest("x"))
	if w.Code != http.StatusOK || w.Header().Get("X-Ratelimit-Limit") != "2" {
		t.Fatalf("after the expiry: %d, limit %q; want 200 under the config's limit of 2", w.Code, w.Header().Get("X-Ratelimit-Limit"))
	}
	if n := passes(h, "x", 3); n != 0 {
		t.Fatalf("after the expiry: %d more passed, want none", n)
	}
}

// TestKeyOverrideEveryAlgorithm: a key's override gives its bucket its own
// limit in every algorithm, in memory and in Redis.
func TestKeyOverrideEveryAlgorithm(t *testing.T) {
	stores := map[string]*RedisConfig{"memory": nil, "redis": {Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("ovr%x:", rand.Uint64())}}
	for store, redis := range stores {
		for _, algo := range []string{"token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter", "leaky_bucket"} {
			t.Run(store+"/"+algo, func(t *testing.T) {
				z := &Zone{Rate: "2r/h", Algorithm: algo}
				body := `{"key":"vip","rate":"6r/h"}`
				if algo == "leaky_bucket" {
					z.NoDelay, z.Burst, body = true, "1", `{"key":"vip","burst":5}`
				}
				h, zone := overrideZone(t, z, redis)
				mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", body)
				if n := passes(h, "vip", 8); n != 6 {
					t.Errorf("vip: %d passed, want its override's 6", n)
				}
				if n := passes(h, "other", 8); n != 2 {
					t.Errorf("other: %d passed, want the config's 2", n)
				}
			})
		}
	}
	t.Run("concurrency", func(t *testing.T) {
		h, zone := overrideZone(t, &Zone{MaxConcurrent: 1}, nil)
		mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"vip","max_concurrent":4}`)
		if got := serve(h, keyRequest("vip")).Header().Get("X-Ratelimit-Limit"); got != "4" {
			t.Fatalf("vip's limit %q, want 4", got)
		}
	})
}

// BenchmarkServeHTTPOverrides: the request path (the handler alone, as
// BenchmarkServeHTTP, memory store) with no override, with 10,000 key
// overrides in the zone (the client's key not among them, and among them:
// its own limit), and with a zone's override.
func BenchmarkServeHTTPOverrides(b *testing.B) {
	for _, c := range []struct {
		name       string
		keys       int
		hit, zoned bool
	}{{"none", 0, false, false}, {"10000_keys", 10000, false, false}, {"10000_keys_hit", 10000, true, false}, {"zone", 0, false, true}} {
		b.Run(c.name, func(b *testing.B) {
			h := benchHandler(b, fmt.Sprintf("bench_ovr%x", rand.Uint64()), "{http.request.header.X-Key}", 1, "1000000r/s")
			z := h.zones[0]
			ctx := b.Context()
			for i := range c.keys {
				d := z.bucket(fmt.Sprint("customer-", i)).Digest()
				if err := h.store.overrides.Put(ctx, z.name, &d, overrides.Override{Rate: "2000000r/s"}); err != nil {
					b.Fatal(err)
				}
			}
			if c.hit {
				d := z.bucket("client-1").Digest()
				if err := h.store.overrides.Put(ctx, z.name, &d, overrides.Override{Rate: "2000000r/s"}); err != nil {
					b.Fatal(err)
				}
			}
			if c.zoned {
				if err := h.store.overrides.Put(ctx, z.name, nil, overrides.Override{Rate: "2000000r/s", Expires: time.Now().Add(time.Hour).UnixMilli()}); err != nil {
					b.Fatal(err)
				}
			}
			s := newBenchServer(b, h, http.StatusOK)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				s.serve(b)
			}
		})
	}
}

// TestOverrideOfASyncedWindow: a window zone that syncs takes no override
// whose window is less than twice its sync (the config's own check): the
// API refuses it, saying why, and one written to the store anyway (by
// another instance's config) is left out, with the config's limit.
func TestOverrideOfASyncedWindow(t *testing.T) {
	redisCfg := &RedisConfig{Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("ovs%x:", rand.Uint64())}
	h, zone := overrideZone(t, &Zone{Rate: "20r/4s", Algorithm: "fixed_window", Sync: caddy.Duration(2 * time.Second)}, redisCfg)
	status, out := adminCall(t, "PUT", "/rate_limit/overrides/"+zone, `{"rate":"10r/1s"}`)
	if status != 400 || !strings.Contains(out, "at most half the window") {
		t.Fatalf("an override of a 1s window on a zone that syncs every 2s: %d %s, want 400 saying why", status, out)
	}
	core, logs := observer.New(zap.InfoLevel)
	h.logger = zap.New(core)
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone, `{"rate":"10r/4s"}`) // fits
	if logs.FilterField(zap.Int64("sync_bound", 5)).Len() != 1 {            // one instance: rate × sync, 10/4s × 2s
		t.Fatalf("the override's log does not give the bound under it: %v", logs.All())
	}
	o := overrides.Override{Rate: "10r/1s"}
	if err := h.store.overrides.Put(context.Background(), zone, nil, o); err != nil {
		t.Fatal(err)
	}
	w := serve(h, keyRequest("k"))
	if got := w.Header().Get("X-Ratelimit-Limit"); got != "20" {
		t.Fatalf("under a stored override of a 1s window: limit %q, want the config's 20", got)
	}
}

// TestOverridesSurviveAnEmptyRedis: the Redis that holds the overrides is
// killed and restarted empty: the instance writes back the override it
// holds, counts it, enforces it, and lists it.
func TestOverridesSurviveAnEmptyRedis(t *testing.T) {
	srv := redistest.NewServer(t)
	prefix := fmt.Sprintf("ovrst%x:", rand.Uint64())
	name := fmt.Sprintf("ovr_%x", rand.Uint64())
	h := &Handler{Zones: map[string]*Zone{name: {Rate: "20r/m", Key: "{http.request.header.X-Key}"}},
		Redis: &RedisConfig{Addresses: []string{srv.Addr}, KeyPrefix: prefix}, OverridesPoll: caddy.Duration(200 * time.Millisecond)}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+name, `{"rate":"4r/m"}`)
	restored := metrics.overridesRestored.WithLabelValues(h.store.label())
	before := testutil.ToFloat64(restored)
	srv.Kill()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(restored) == before {
		if time.Now().After(deadline) {
			t.Fatal("no restore counted within 10s of Redis restarting empty")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := passes(h, "a", 6); n != 4 {
		t.Fatalf("%d of 6 requests passed after the restart, want the override's 4", n)
	}
	if out := mustAdmin(t, "GET", "/rate_limit/overrides", ""); !strings.Contains(out, `"zone":"`+name+`","kind":"limit","rate":"4r/m"`) {
		t.Fatalf("the listing after the restart: %s", out)
	}
	if got := testutil.ToFloat64(restored) - before; got != 1 {
		t.Fatalf("%v restores counted, want 1", got)
	}
}
