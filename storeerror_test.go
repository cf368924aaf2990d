package ratelimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// TestScriptErrorsStayWithTheirClient: a client whose requests make the
// script fail (here its bucket's key holds another type) gets
// on_store_error for its own requests, and cannot open the breaker for
// everyone: another client is decided by Redis all along.
func TestScriptErrorsStayWithTheirClient(t *testing.T) {
	addr := redistest.StandaloneAddr(t)
	h := redisHandler(t, &RedisConfig{Addresses: []string{addr}}) // deny on store errors
	c := redistest.Dial(t, addr)
	key := redisstore.RedisKey(h.Redis.KeyPrefix, "api", bucket.KeyHash("evil"))
	if _, err := c.Do(t.Context(), "HSET", key, "not", "a bucket"); err != nil {
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

// TestDenyAnswersItself: on_store_error deny answers as a 429 is answered
// (its status, Retry-After and a JSON body), without handing Caddy an
// error, which Caddy would log at error level with the request's headers:
// an outage logs one line per interval, and no client key.
func TestDenyAnswersItself(t *testing.T) {
	h := redisHandler(t, &RedisConfig{Addresses: []string{"127.0.0.1:1"}}) // nothing listens: refused
	core, logs := observer.New(zap.DebugLevel)
	h.logger = zap.New(core)
	h.caller.Events = decisionEvents{logger: h.logger, mode: "deny"}
	for i := range 20 {
		w := httptest.NewRecorder()
		r := keyRequest("secret-api-key")
		caddyhttp.NewTestReplacer(r)
		err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		if err != nil || w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "2" ||
			!strings.Contains(w.Body.String(), `"error":"rate limit store unavailable"`) {
			t.Fatalf("request %d: error %v, status %d, Retry-After %q, body %q; want no error, a 503 of its own",
				i, err, w.Code, w.Header().Get("Retry-After"), w.Body.String())
		}
	}
	if n := logs.FilterLevelExact(zap.WarnLevel).Len() + logs.FilterLevelExact(zap.ErrorLevel).Len(); n > 2 {
		t.Fatalf("%d warn and error lines for 20 denied requests; want the failure and one deny line", n)
	}
	for _, l := range logs.All() {
		if strings.Contains(fmt.Sprint(l.Message, l.ContextMap()), "secret-api-key") {
			t.Fatalf("a client key in a log line: %v %v", l.Message, l.ContextMap())
		}
	}
}

// TestDenyShowsNoQuotaLeft: on_store_error deny's refusal carries no limit
// header of an outer handler that says quota is left.
func TestDenyShowsNoQuotaLeft(t *testing.T) {
	outer := &Handler{Headers: "both", Zones: map[string]*Zone{"site": {Key: "k", Rate: "30r/m"}}}
	if err := provision(t, outer); err != nil {
		t.Fatal(err)
	}
	inner := redisHandler(t, &RedisConfig{Addresses: []string{"127.0.0.1:1"}})
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	})
	w := serveWith(outer, keyRequest("k"), next)
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d; want 503 from the inner handler", w.Code)
	}
	for _, h := range []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Remaining"} {
		if v := w.Header().Get(h); v != "" {
			t.Errorf("the deny carries the outer handler's %s: %q", h, v)
		}
	}
}
