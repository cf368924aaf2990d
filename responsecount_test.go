package ratelimit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestCaddyfileSettle(t *testing.T) {
	out, err := adapt(t, `:8080 {
	rate_limit {
		zone login {
			key  {client_ip}
			rate 5r/m
			count_status 401 403 5xx
		}
		zone llm {
			key  {http.request.header.X-API-Key}
			rate 1000r/m
			cost_from_response X-Tokens-Used strip
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"count_status":[401,403,5]`, `"cost_from_response":"X-Tokens-Used"`, `"strip_cost_header":true`} {
		if !strings.Contains(out, want) {
			t.Errorf("adapted config lacks %s in\n%s", want, out)
		}
	}
}

func TestCaddyfileSettleErrors(t *testing.T) {
	zone := func(body string) string {
		return ":8080 {\n\trate_limit {\n\t\tzone api {\n\t\t\tkey k\n" + body + "\n\t\t}\n\t}\n}\n"
	}
	cases := []struct{ name, src, want string }{
		{"no status", zone("\t\t\trate 1r/s\n\t\t\tcount_status"), `want count_status <status>..., e.g. count_status 401 403, or 4xx, at Caddyfile:6`},
		{"bad status", zone("\t\t\trate 1r/s\n\t\t\tcount_status 4x"), `count_status "4x": want a status such as 401, or a class such as 4xx, at Caddyfile:6`},
		{"status out of range", zone("\t\t\trate 1r/s\n\t\t\tcount_status 700"), `count_status 700: want a status from 100 to 599, or a class from 1 to 5 (4 for 4xx), at Caddyfile:6`},
		{"max_concurrent", zone("\t\t\tmax_concurrent 2\n\t\t\tcount_status 401"), `count_status and cost_from_response do not apply to max_concurrent`},
		{"cost without debt", zone("\t\t\trate 1r/s\n\t\t\talgorithm sliding_window_log\n\t\t\tcost_from_response X-Cost"),
			`cost_from_response charges after the response, into debt if need be: it needs token_bucket or leaky_bucket, not sliding_window_log, at Caddyfile:7`},
		{"cost in a window", zone("\t\t\trate 1r/s\n\t\t\talgorithm fixed_window\n\t\t\tcost_from_response X-Cost"), `not fixed_window`},
		{"bad strip", zone("\t\t\trate 1r/s\n\t\t\tcost_from_response X-Cost remove"), `want cost_from_response <header> [strip], at Caddyfile:6`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := adapt(t, c.src)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

// TestSettleStatus: the status that counts is the one written, 200 when
// the handler writes a body without one or writes nothing, and a
// handler error's status (as Caddy's handle_errors sees it) when it
// returns one unwritten.
func TestSettleStatus(t *testing.T) {
	cases := map[string]struct {
		next    caddyhttp.HandlerFunc
		charged bool // 401 counts, nothing else does
	}{
		"401 written": {func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(http.StatusUnauthorized)
			return nil
		}, true},
		"body without status": {func(w http.ResponseWriter, _ *http.Request) error {
			_, err := io.WriteString(w, "ok")
			return err
		}, false},
		"body through ReadFrom": {func(w http.ResponseWriter, _ *http.Request) error {
			_, err := w.(io.ReaderFrom).ReadFrom(strings.NewReader("ok"))
			return err
		}, false},
		"nothing written": {func(http.ResponseWriter, *http.Request) error { return nil }, false},
		"401 error":       {func(http.ResponseWriter, *http.Request) error { return caddyhttp.Error(401, nil) }, true},
		"wrapped 401": {func(http.ResponseWriter, *http.Request) error {
			return fmt.Errorf("auth: %w", caddyhttp.Error(401, nil))
		}, true},
		"other error: 500": {func(http.ResponseWriter, *http.Request) error { return io.EOF }, false},
		"early hints then 401": {func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusUnauthorized)
			return nil
		}, true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			h := &Handler{Zones: map[string]*Zone{"login": {Rate: "2r/m", CountStatus: []int{401}}}}
			if err := provision(t, h); err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodPost, "/login", nil)
			for i := range 2 {
				serveWith(h, r, c.next)
				w := serve(h, r) // a request that does not count: shows the bucket after its refund
				switch {
				case c.charged && i == 1: // two charged: the bucket is empty
					if w.Code != http.StatusTooManyRequests {
						t.Fatalf("after %d: status %d; want 429", i+1, w.Code)
					}
				case c.charged && w.Header().Get("X-RateLimit-Remaining") != "1",
					!c.charged && w.Header().Get("X-RateLimit-Remaining") != "2":
					t.Fatalf("after %d: X-RateLimit-Remaining %q; charged: %v", i+1, w.Header().Get("X-RateLimit-Remaining"), c.charged)
				}
			}
		})
	}
}

// TestSettleCostHeader: the cost header's amount is charged (into debt),
// the headers show the state after the charge, the header is stripped;
// a missing or malformed value charges the zone's cost and warns once.
func TestSettleCostHeader(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"llm": {Key: "{http.request.header.X-Key}", Rate: "10r/m", Cost: "2",
		CostFromResponse: "X-Cost", StripCostHeader: true}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	answer := func(v string) caddyhttp.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) error {
			if v != "" {
				w.Header().Set("X-Cost", v)
			}
			w.WriteHeader(http.StatusOK)
			return nil
		}
	}
	cases := []struct {
		key, cost, remaining string
		status               int
	}{
		{"a", "12", "0", 200}, // 2 taken, 10 more charged: 2 owed
		{"a", "1", "0", 429},  // owes 2, then needs 2
		{"b", "", "8", 200},   // missing: the zone's cost, 2
		{"b", "x", "6", 200},  // malformed: 2
		{"b", "0", "6", 200},  // 2 given back
		{"b", "99999999999999999999", "0", 200},
		{"b", "1", "0", 429},
	}
	for i, c := range cases {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Key", c.key)
		w := serveWith(h, r, answer(c.cost))
		if w.Code != c.status || w.Header().Get("X-RateLimit-Remaining") != c.remaining || w.Header().Get("X-Cost") != "" {
			t.Fatalf("request %d (%s, X-Cost %q): status %d, remaining %q, X-Cost %q; want %d, %s, stripped", i+1, c.key, c.cost,
				w.Code, w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("X-Cost"), c.status, c.remaining)
		}
	}
	if !h.Zones["llm"].warned[fieldResponseCost].Load() {
		t.Fatal("no warning for a missing cost header")
	}
}

// TestSettleClientGone: a request whose client hung up keeps its charge,
// whatever the zone counts: reverse_proxy answers it 499 once the
// upstream may already have done the work.
func TestSettleClientGone(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"sms": {Rate: "3r/h", CountStatus: []int{2}}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	hangUp := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		return caddyhttp.Error(499, context.Canceled) // as reverse_proxy, the client gone
	})
	for range 3 {
		serveWith(h, httptest.NewRequest(http.MethodPost, "/sms", nil), hangUp)
	}
	if w := serve(h, httptest.NewRequest(http.MethodPost, "/sms", nil)); w.Code != http.StatusTooManyRequests {
		t.Fatalf("after 3 requests whose clients left: status %d, remaining %q; want 429", w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
}

// TestSettlePanic: a request whose next handler panics keeps its charge
// and gives its concurrency slot back.
func TestSettlePanic(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{
		"ok":    {Rate: "2r/h", CountStatus: []int{2}},
		"slots": {MaxConcurrent: 1},
	}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	boom := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { panic("boom") })
	func() {
		defer func() { _ = recover() }()
		serveWith(h, httptest.NewRequest(http.MethodGet, "/", nil), boom)
	}()
	w := serve(h, httptest.NewRequest(http.MethodGet, "/", nil)) // its slot is free, its charge stays
	if w.Code != http.StatusOK {
		t.Fatalf("after a panic: status %d; want 200 (the slot given back)", w.Code)
	}
	if w := serve(h, httptest.NewRequest(http.MethodGet, "/", nil)); w.Code != http.StatusTooManyRequests {
		t.Fatalf("third request: status %d; want 429 (the panicking request kept its charge)", w.Code)
	}
}

// TestSettleClientGoneAnyError: a request whose client went away keeps
// its charge whatever error its handler returns, not only reverse_proxy's
// 499.
func TestSettleClientGoneAnyError(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"sms": {Rate: "3r/h", CountStatus: []int{2}}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/sms", nil)
		serveWith(h, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			cancel() // the client hangs up while the work is done
			return context.Canceled
		}))
	}
	if w := serve(h, httptest.NewRequest(http.MethodPost, "/sms", nil)); w.Code != http.StatusTooManyRequests {
		t.Fatalf("after 3 requests whose clients left: status %d, remaining %q; want 429", w.Code, w.Header().Get("X-RateLimit-Remaining"))
	}
}
