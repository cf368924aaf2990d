package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// fakeClock is a handler's clock that a test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
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

func adapt(t *testing.T, src string) (string, error) {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	return string(out), err
}

// clientRequest is a request to path with a method, from a client address.
func clientRequest(method, path, remote string) *http.Request {
	r := httptest.NewRequest(method, path, nil)
	r.RemoteAddr = remote + ":4321"
	orig := *r // {http.request.orig_uri.*}, which Caddy's server sets
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.OriginalRequestCtxKey, orig))
}

// expectStatus serves r and checks its status and, for a 429,
// Retry-After.
func expectStatus(t *testing.T, h *Handler, r *http.Request, status int, retryAfter string) {
	t.Helper()
	w := serve(h, r)
	if w.Code != status || status == http.StatusTooManyRequests && w.Header().Get("Retry-After") != retryAfter {
		t.Fatalf("%s %s: status %d, Retry-After %q; want %d, %q", r.Method, r.URL.Path, w.Code, w.Header().Get("Retry-After"), status, retryAfter)
	}
}

// configPrefix is a prefix length as a config gives it: 0 is an
// explicit 0.
func configPrefix(n int) PrefixLength {
	if n == 0 {
		return noGrouping
	}
	return PrefixLength(n)
}

// eventRecorder is an events handler that keeps what it is given.
type eventRecorder struct {
	mu     sync.Mutex
	events []caddy.Event
}

func (e *eventRecorder) Handle(_ context.Context, ev caddy.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, ev)
	return nil
}

// withEvents gives h a running events app on which sub listens to
// rate_limit_exceeded.
func withEvents(t testing.TB, h *Handler, sub caddyevents.Handler) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	app := new(caddyevents.App)
	if err := app.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := app.On(exceededEvent, sub); err != nil {
		t.Fatal(err)
	}
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	h.events, h.eventCtx = app, ctx
}
