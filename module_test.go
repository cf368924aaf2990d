package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
)

// FuzzServeHTTP: whatever the headers (token, API key, client address,
// burst and cost), a request is answered 200 or 429, never a crash, on
// every algorithm: each takes its cost from X-Cost (but the concurrency
// limit, which has none).
func FuzzServeHTTP(f *testing.F) {
	secret := strings.Repeat("s", 32)
	const client, cost = "{http.request.header.X-Client}", "{http.request.header.X-Cost}"
	h := &Handler{
		JWT: &JWTConfig{Secret: secret},
		Zones: map[string]*Zone{
			"ip": {Key: client, Rate: "1000r/s", IPv4Prefix: 24, IPv6Prefix: 64},
			"user": {Key: "{http.rate_limit.jwt.sub}:{http.request.header.X-API-Key}", Rate: "{http.rate_limit.jwt.rate}",
				DefaultRate: "100r/s", Burst: "{http.request.header.X-Burst}", Cost: cost},
			"org":     {Key: "{http.rate_limit.jwt.org.id}", Rate: "1r/s", OnEmptyKey: "skip"},
			"fixed":   {Key: client, Rate: "1000r/s", Algorithm: "fixed_window", Cost: cost},
			"log":     {Key: client, Rate: "1000r/s", Algorithm: "sliding_window_log", Cost: cost},
			"counter": {Key: client, Rate: "1000r/s", Algorithm: "sliding_window_counter", Cost: cost},
			"leaky": {Key: client, Rate: "1000r/s", Algorithm: "leaky_bucket", NoDelay: true,
				Burst: "{http.request.header.X-Burst}", DefaultBurst: 100, Cost: cost},
			"slots": {Key: client, MaxConcurrent: 2},
		},
	}
	if err := provision(f, h); err != nil {
		f.Fatal(err)
	}
	valid, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "alice", "rate": "5r/s", "org": map[string]any{"id": "o1"}, "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString([]byte(secret))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("Bearer "+valid, "key-1", "10.0.0.1", "5", "1")
	f.Add("Bearer x.y.z", "", "2001:db8::1", "{", "999999999999999999999")
	f.Add("", "{a}", "::ffff:1.2.3.4", "-1", "0")
	f.Add("bearer  ", "\x00", "not an ip", "1e9", " 2")
	// More than any limit, for a client the first seed charged: refused,
	// with no count wrapped; 2^53+1 is not exact in a float64.
	f.Add("", "key-1", "10.0.0.1", "10", "9223372036854775807")
	f.Add("", "key-1", "10.0.0.1", "10", "9007199254740993")
	f.Fuzz(func(t *testing.T, auth, apiKey, client, burst, cost string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["Authorization"] = []string{auth}
		r.Header["X-Api-Key"] = []string{apiKey}
		r.Header["X-Client"] = []string{client}
		r.Header["X-Burst"] = []string{burst}
		r.Header["X-Cost"] = []string{cost}
		if w := serve(h, r); w.Code != http.StatusOK && w.Code != http.StatusTooManyRequests {
			t.Fatalf("status %d", w.Code)
		}
	})
}

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
		"skip, no key":   {map[string]*Zone{"a": {Rate: "1r/s", OnEmptyKey: "skip"}}, `zone "a": on_empty_key skip needs a key`},
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
