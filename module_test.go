package ratelimit

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
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

// BenchmarkServeHTTP: an allowed request on the memory store, through one
// zone or three, keyed by a header or by the client address, with the
// X-RateLimit headers or (one_zone_ietf) the IETF ones; then one zone on
// the standalone Redis, decided there (redis_standalone) or from the
// allowance of a zone that syncs every 100ms (redis_sync); the handler
// alone (see benchServer). caddy_request and caddy_request_no_handler add
// what Caddy's server makes for every request (a replacer, the request's
// context values, a header map with Server): their difference is the
// handler's cost in Caddy, the first placeholder's map included.
func BenchmarkServeHTTP(b *testing.B) {
	for _, c := range []struct {
		name, key, headers string
		zones              int
	}{{"one_zone", "{http.request.header.X-Key}", "", 1}, {"three_zones", "{http.request.header.X-Key}", "", 3},
		{"one_zone_client_ip", "{http.vars.client_ip}", "", 1}, {"one_zone_ietf", "{http.request.header.X-Key}", "ietf", 1}} {
		b.Run(c.name, func(b *testing.B) {
			h := benchHandler(b, "bench", c.key, c.zones, "1000000r/s")
			h.Headers = c.headers
			s := newBenchServer(b, h, http.StatusOK)
			b.ReportAllocs()
			for b.Loop() {
				s.serve(b)
			}
		})
	}
	b.Run("redis_standalone", func(b *testing.B) {
		h := &Handler{Zones: map[string]*Zone{"bench_a": {Key: "{http.request.header.X-Key}", Rate: "1000000r/s"}},
			Redis: &RedisConfig{Addresses: []string{redistest.StandaloneAddr(b)}}}
		if err := provision(b, h); err != nil {
			b.Fatal(err)
		}
		h.logger = infoLogger()
		s := newBenchServer(b, h, http.StatusOK)
		b.ReportAllocs()
		for b.Loop() {
			s.serve(b)
		}
	})
	b.Run("redis_sync", func(b *testing.B) {
		h := syncHandler(b, "bench_sync", "1000000000r/s")
		s := newBenchServer(b, h, http.StatusOK)
		s.serve(b) // the bucket's first request, in Redis, seeds its entry
		b.ReportAllocs()
		for b.Loop() {
			s.serve(b)
		}
	})
	for _, name := range []string{"caddy_request", "caddy_request_no_handler"} {
		b.Run(name, func(b *testing.B) {
			h := benchHandler(b, "bench", "{http.request.header.X-Key}", 1, "1000000r/s")
			r := benchRequest()
			b.ReportAllocs()
			for b.Loop() {
				benchCaddyRequest(b, h, r, name == "caddy_request")
			}
		})
	}
}

// benchHandler is a handler of n zones of rate (named prefix_a, _b...),
// keyed by key, provisioned
// with a logger at Caddy's default level, info (in tests, Caddy gives
// handlers a debug logger, which would write every refusal).
func benchHandler(b *testing.B, prefix, key string, n int, rate string) *Handler {
	h := &Handler{Zones: map[string]*Zone{}}
	for i := range n {
		h.Zones[prefix+"_"+string(rune('a'+i))] = &Zone{Key: key, Rate: rate}
	}
	if err := provision(b, h); err != nil {
		b.Fatal(err)
	}
	h.logger = infoLogger()
	return h
}

// infoLogger discards what it is given, at Caddy's default level, info.
func infoLogger() *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))
}

// benchRequest is a request from client-1 (its X-Key and its address).
func benchRequest() *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Key", "client-1")
	r.RemoteAddr = "192.0.2.1:4321"
	return r
}

// benchServer serves one request through a handler over and over, and
// measures the handler alone: what Caddy's server makes for every request
// whether or not it limits it (the request's context with its replacer
// and {http.vars.*}, the response writer and its header map) is made
// once here and reused. Between requests the header map is cleared (its
// room kept, as a new request's map has room for a few fields) and the
// placeholders the handler set stay, to be set again. next answers 200.
type benchServer struct {
	h    *Handler
	r    *http.Request
	w    *benchWriter
	want int
}

func newBenchServer(b *testing.B, h *Handler, want int) *benchServer {
	r := benchRequest()
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: "192.0.2.1"}))
	caddyhttp.NewTestReplacer(r)
	return &benchServer{h: h, r: r, w: &benchWriter{hdr: http.Header{}}, want: want}
}

func (s *benchServer) serve(b *testing.B) {
	clear(s.w.hdr)
	s.w.hdr["Server"] = benchServerHeader
	s.w.code = 0
	err := s.h.ServeHTTP(s.w, s.r, benchNext)
	if err != nil || s.w.code != s.want {
		b.Fatalf("status %d, error %v; want %d", s.w.code, err, s.want)
	}
}

var benchServerHeader = []string{"Caddy"}

// benchNext is the next handler: 200, no body.
var benchNext = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	w.WriteHeader(http.StatusOK)
	return nil
})

// benchWriter is a ResponseWriter that keeps the status and discards the
// body; net/http's, which clones the header map at WriteHeader (for
// every response, with or without this handler), is left out.
type benchWriter struct {
	hdr  http.Header
	code int
}

func (w *benchWriter) Header() http.Header         { return w.hdr }
func (w *benchWriter) WriteHeader(code int)        { w.code = code }
func (w *benchWriter) Write(p []byte) (int, error) { return len(p), nil }

// benchCaddyRequest serves r as Caddy's server would prepare it (a new
// replacer and vars, a header map holding Server), through h or, without
// handler, straight to next.
func benchCaddyRequest(b *testing.B, h *Handler, r *http.Request, handler bool) {
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: "192.0.2.1"}))
	caddyhttp.NewTestReplacer(r)
	w := &benchWriter{hdr: http.Header{"Server": benchServerHeader}}
	if !handler {
		_ = benchNext.ServeHTTP(w, r)
	} else if err := h.ServeHTTP(w, r, benchNext); err != nil {
		b.Fatal(err)
	}
	if w.code != http.StatusOK {
		b.Fatalf("status %d", w.code)
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

// BenchmarkServeHTTPRefused: the refusal path, the handler alone (see
// benchServer), its logger at info level (Caddy's default): as it is by
// default (no events app), with an event subscriber (whose events app
// logs each event with the debug logger Caddy gives tests), and with
// log_refusals (throttled: no line written); and refused by the
// allowance of a zone that syncs every 100ms (redis_sync, 1r/h).
func BenchmarkServeHTTPRefused(b *testing.B) {
	b.Run("redis_sync", func(b *testing.B) {
		h := syncHandler(b, "refused_sync", "1r/h")
		serve(h, benchRequest()) // the one request allowed, in Redis, seeds the bucket's entry
		s := newBenchServer(b, h, http.StatusTooManyRequests)
		b.ReportAllocs()
		for b.Loop() {
			s.serve(b)
		}
	})
	for _, c := range []string{"default", "event_subscriber", "log_refusals"} {
		b.Run(c, func(b *testing.B) {
			h := &Handler{Zones: map[string]*Zone{"a": {Key: "{http.request.header.X-Key}", Rate: "1r/h"}}}
			if c == "log_refusals" {
				h.LogRefusals = &RefusalLog{}
			}
			if err := provision(b, h); err != nil {
				b.Fatal(err)
			}
			h.logger = infoLogger()
			if c == "event_subscriber" {
				withEvents(b, h, new(eventRecorder))
			}
			serve(h, benchRequest()) // the one request allowed
			s := newBenchServer(b, h, http.StatusTooManyRequests)
			b.ReportAllocs()
			for b.Loop() {
				s.serve(b)
			}
		})
	}
}
