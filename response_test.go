package ratelimit

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// ietfItem is one item of a RateLimit or RateLimit-Policy field as this
// module writes it: "name";k=v;k=v with integer values.
type ietfItem struct {
	name   string
	params map[string]int64
}

func parseIETFItem(t *testing.T, field, s string) ietfItem {
	t.Helper()
	parts := strings.Split(s, ";")
	name, err := strconv.Unquote(parts[0])
	if err != nil {
		t.Fatalf("%s %q: name not a quoted string", field, s)
	}
	it := ietfItem{name: name, params: map[string]int64{}}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil {
			t.Fatalf("%s %q: parameter %q is not k=<integer>", field, s, p)
		}
		it.params[k] = n
	}
	return it
}

// TestIETFHeadersAgree: RateLimit-Policy describes the quota that
// RateLimit's r counts down, whatever the algorithm: q is the limit
// (the burst of a token bucket, the rate of a window, the burst + 1 of a
// leaky bucket), w the seconds in which the whole quota comes back, and
// r never exceeds q.
func TestIETFHeadersAgree(t *testing.T) {
	cases := map[string]struct {
		zone      *Zone
		q, w, r0  int64 // the policy, and r after the first request
		maxPassed int   // requests that pass at once
	}{
		"token bucket with a burst":  {&Zone{Rate: "1r/s", Burst: "100"}, 100, 100, 99, 100},
		"token bucket, burst = rate": {&Zone{Rate: "100r/m"}, 100, 60, 99, 100},
		"token bucket, slow refill":  {&Zone{Rate: "2r/s", Burst: "5"}, 5, 3, 4, 5},
		"token bucket, 45r/s":        {&Zone{Rate: "45r/s"}, 45, 1, 44, 45},
		"fixed window":               {&Zone{Rate: "10r/m", Algorithm: "fixed_window"}, 10, 60, 9, 10},
		"sliding window log":         {&Zone{Rate: "5r/10s", Algorithm: "sliding_window_log"}, 5, 10, 4, 5},
		"sliding window counter":     {&Zone{Rate: "5r/h", Algorithm: "sliding_window_counter"}, 5, 3600, 4, 5},
		"leaky bucket":               {&Zone{Rate: "1r/s", Burst: "5", Algorithm: "leaky_bucket", NoDelay: true}, 6, 6, 5, 6},
		"leaky bucket, no burst":     {&Zone{Rate: "1r/m", Algorithm: "leaky_bucket"}, 1, 60, 0, 1},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			c.zone.Key = "{http.request.header.X-Key}"
			h := &Handler{Headers: "ietf", Zones: map[string]*Zone{"api": c.zone}}
			if err := provision(t, h); err != nil {
				t.Fatal(err)
			}
			passed := 0
			for i := range c.maxPassed + 2 {
				w := serve(h, keyRequest("client"))
				if w.Code == http.StatusOK {
					passed++
				}
				p := parseIETFItem(t, "RateLimit-Policy", w.Header().Get("RateLimit-Policy"))
				s := parseIETFItem(t, "RateLimit", w.Header().Get("RateLimit"))
				if p.name != "api" || s.name != "api" {
					t.Fatalf("request %d: policy %q, state %q; want both named after the zone", i, p.name, s.name)
				}
				if p.params["q"] != c.q || p.params["w"] != c.w {
					t.Fatalf("request %d: RateLimit-Policy %q; want q=%d;w=%d", i, w.Header().Get("RateLimit-Policy"), c.q, c.w)
				}
				if r := s.params["r"]; r > p.params["q"] || r < 0 || i == 0 && r != c.r0 {
					t.Fatalf("request %d: RateLimit %q next to RateLimit-Policy %q; want 0 <= r <= q (r=%d first)",
						i, w.Header().Get("RateLimit"), w.Header().Get("RateLimit-Policy"), c.r0)
				}
			}
			if passed != c.maxPassed {
				t.Fatalf("%d requests passed; want the quota, %d", passed, c.maxPassed)
			}
		})
	}
}

// TestQuotaWindowExact: w is exact where floats are not (45 × (1s/45)
// comes to just over 1s in float64), and bounded for the largest policies.
func TestQuotaWindowExact(t *testing.T) {
	for n := int64(1); n <= 5000; n++ {
		token := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: n, Period: time.Second, Burst: n}
		leaky := limiter.Policy{Algorithm: limiter.LeakyBucket, Rate: n, Period: time.Second, Burst: n - 1}
		if w := quotaWindow(token, token.Limit()); w != 1 {
			t.Fatalf("%dr/s burst %d: w=%d; want 1", n, n, w)
		}
		if w := quotaWindow(token, token.Limit()+1); w != 2 {
			t.Fatalf("%dr/s, quota %d: w=%d; want 2", n, n+1, w)
		}
		if w := quotaWindow(leaky, leaky.Limit()); w != 1 {
			t.Fatalf("leaky %dr/s burst %d: w=%d; want 1", n, n-1, w)
		}
	}
	fixed := limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 1, Period: time.Millisecond, Burst: 1}
	if w := quotaWindow(fixed, 1); w != 1 {
		t.Fatalf("1r/ms window: w=%d; want at least 1", w)
	}
	huge := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: bucket.MaxPeriod, Burst: 1 << 40}
	if w := quotaWindow(huge, huge.Limit()); w != math.MaxInt64/int64(time.Second) {
		t.Fatalf("a refill beyond 2^64ns: w=%d; want the cap", w)
	}
}

// refusalTranscript is what a client sees of a response: the status, every
// header (sorted) and the body, byte for byte.
func refusalTranscript(w *httptest.ResponseRecorder) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(w.Code) + "\n")
	hdr := w.Header()
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteString(k + ": " + strings.Join(hdr[k], ", ") + "\n")
	}
	b.WriteString("\n" + w.Body.String())
	return b.String()
}

// pinnedRefusal serves requests through h (on a stopped clock) until one is
// refused, and returns what its client sees; with handle_errors, the error's
// status and message take the body's place.
func pinnedRefusal(t *testing.T, h *Handler, r func() *http.Request) string {
	t.Helper()
	clock := &fakeClock{t: time.Unix(1_700_000_000, 250_000_000)}
	h.now = clock.Now
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		w := httptest.NewRecorder()
		req := r()
		caddyhttp.NewTestReplacer(req)
		err := h.ServeHTTP(w, req, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			w.Code = he.StatusCode
			w.Body.WriteString(he.Err.Error())
		}
		if w.Code == http.StatusTooManyRequests {
			return refusalTranscript(w)
		}
	}
	t.Fatal("never refused")
	return ""
}

// TestRefusalBytes pins, byte for byte, the headers and bodies of refusals
// (JSON, problem, handle_errors; X-RateLimit and IETF headers) for
// policies of every kind, so that the way they are written may change but
// not what they are.
func TestRefusalBytes(t *testing.T) {
	plan := func() *http.Request { r := keyRequest("c"); r.Header.Set("X-Plan", "3r/h"); return r }
	client := func() *http.Request { return keyRequest("c") }
	problem := func() *http.Request {
		r := keyRequest("c")
		r.Header.Set("Accept", "application/problem+json")
		return r
	}
	cases := []struct {
		name string
		h    *Handler
		r    func() *http.Request
		want string
	}{
		{"rate 100r/m, json", &Handler{Zones: map[string]*Zone{"pin_json": {Key: "{http.request.header.X-Key}", Rate: "100r/m"}}}, client,
			"429\nContent-Length: 162\nContent-Type: application/json\nRetry-After: 1\nX-Ratelimit-Limit: 100\nX-Ratelimit-Remaining: 0\nX-Ratelimit-Reset: 1700000061\n\n{\"error\":\"rate limit exceeded\",\"message\":\"You have exceeded the rate limit of 100 requests per minute. Try again in 1 second.\",\"zone\":\"pin_json\",\"retry_after\":1}\n"},
		{"rate 1r/s burst 5, problem", &Handler{Response: "problem", Zones: map[string]*Zone{"pin_problem": {Key: "{http.request.header.X-Key}", Rate: "1r/s", Burst: "5"}}}, client,
			"429\nContent-Length: 193\nContent-Type: application/problem+json\nRetry-After: 1\nX-Ratelimit-Limit: 5\nX-Ratelimit-Remaining: 0\nX-Ratelimit-Reset: 1700000006\n\n{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"You have exceeded the rate limit of 1 request per second. Try again in 1 second.\",\"zone\":\"pin_problem\",\"retry_after\":1}\n"},
		{"fixed window 10r/m, both headers", &Handler{Headers: "both", Zones: map[string]*Zone{"pin-window.a": {Key: "{http.request.header.X-Key}", Rate: "10r/m", Algorithm: "fixed_window"}}}, client,
			"429\nContent-Length: 168\nContent-Type: application/json\nRatelimit: \"pin-window.a\";r=0;t=40\nRatelimit-Policy: \"pin-window.a\";q=10;w=60\nRetry-After: 40\nVary: Accept\nX-Ratelimit-Limit: 10\nX-Ratelimit-Remaining: 0\nX-Ratelimit-Reset: 1700000040\n\n{\"error\":\"rate limit exceeded\",\"message\":\"You have exceeded the rate limit of 10 requests per minute. Try again in 40 seconds.\",\"zone\":\"pin-window.a\",\"retry_after\":40}\n"},
		{"events in a 90s window, ietf, problem", &Handler{Headers: "ietf", Response: "problem", Zones: map[string]*Zone{"pin_events": {Key: "k", MaxEvents: 2, Window: caddy.Duration(90 * time.Second)}}}, client,
			"429\nContent-Length: 200\nContent-Type: application/problem+json\nRatelimit: \"pin_events\";r=0;t=90\nRatelimit-Policy: \"pin_events\";q=2;w=90\nRetry-After: 90\nVary: Accept\n\n{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"You have exceeded the rate limit of 2 requests per 90 seconds. Try again in 90 seconds.\",\"zone\":\"pin_events\",\"retry_after\":90}\n"},
		{"rate 1r/s burst 5, ietf, accepts problem", &Handler{Headers: "ietf", Zones: map[string]*Zone{"pin_quota": {Key: "{http.request.header.X-Key}", Rate: "1r/s", Burst: "5"}}}, problem,
			"429\nContent-Length: 273\nContent-Type: application/problem+json\nRatelimit: \"pin_quota\";r=0;t=1\nRatelimit-Policy: \"pin_quota\";q=5;w=5\nRetry-After: 1\nVary: Accept\n\n{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"Quota Exceeded\",\"status\":429,\"detail\":\"You have exceeded the rate limit of 1 request per second. Try again in 1 second.\",\"violated-policies\":[\"pin_quota\"],\"zone\":\"pin_quota\",\"retry_after\":1}\n"},
		{"sliding window counter 30r/10m, static key", &Handler{Zones: map[string]*Zone{"pin_counter": {Key: "static", Rate: "30r/10m", Algorithm: "sliding_window_counter", Cost: "7"}}}, client,
			"429\nContent-Length: 173\nContent-Type: application/json\nRetry-After: 507\nX-Ratelimit-Limit: 30\nX-Ratelimit-Remaining: 2\nX-Ratelimit-Reset: 1700001000\n\n{\"error\":\"rate limit exceeded\",\"message\":\"You have exceeded the rate limit of 30 requests per 10 minutes. Try again in 507 seconds.\",\"zone\":\"pin_counter\",\"retry_after\":507}\n"},
		{"leaky bucket 1r/m", &Handler{Headers: "both", Zones: map[string]*Zone{"pin_leaky": {Key: "{http.request.header.X-Key}", Rate: "1r/m", Algorithm: "leaky_bucket"}}}, client,
			"429\nContent-Length: 163\nContent-Type: application/json\nRatelimit: \"pin_leaky\";r=0;t=60\nRatelimit-Policy: \"pin_leaky\";q=1;w=60\nRetry-After: 60\nVary: Accept\nX-Ratelimit-Limit: 1\nX-Ratelimit-Remaining: 0\nX-Ratelimit-Reset: 1700000061\n\n{\"error\":\"rate limit exceeded\",\"message\":\"You have exceeded the rate limit of 1 request per minute. Try again in 60 seconds.\",\"zone\":\"pin_leaky\",\"retry_after\":60}\n"},
		{"rate from a placeholder, json", &Handler{Zones: map[string]*Zone{"pin_plan": {Key: "{http.request.header.X-Key}", Rate: "{http.request.header.X-Plan}", DefaultRate: "10r/m"}}}, plan,
			"429\nContent-Length: 165\nContent-Type: application/json\nRetry-After: 1200\nX-Ratelimit-Limit: 3\nX-Ratelimit-Remaining: 0\nX-Ratelimit-Reset: 1700003601\n\n{\"error\":\"rate limit exceeded\",\"message\":\"You have exceeded the rate limit of 3 requests per hour. Try again in 1200 seconds.\",\"zone\":\"pin_plan\",\"retry_after\":1200}\n"},
		{"handle_errors", &Handler{Response: "handle_errors", Zones: map[string]*Zone{"pin_errors": {Key: "{http.request.header.X-Key}", Rate: "1r/d"}}}, client,
			"429\nRetry-After: 86400\nX-Ratelimit-Limit: 1\nX-Ratelimit-Remaining: 0\nX-Ratelimit-Reset: 1700086401\n\nrate limit exceeded in zone \"pin_errors\""},
		{"no headers, 1.5ms window", &Handler{Headers: "none", Response: "json", Zones: map[string]*Zone{"pin_none": {MaxEvents: 1, Window: caddy.Duration(1500 * time.Microsecond)}}}, client,
			"429\nContent-Length: 158\nContent-Type: application/json\nRetry-After: 1\n\n{\"error\":\"rate limit exceeded\",\"message\":\"You have exceeded the rate limit of 1 request per 1.5ms. Try again in 1 second.\",\"zone\":\"pin_none\",\"retry_after\":1}\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := pinnedRefusal(t, c.h, c.r); got != c.want {
				t.Errorf("got\n%s\nwant\n%s", got, c.want)
				t.Logf("GOLDEN %q", got)
			}
		})
	}
}

// TestRefusalBytesConcurrency pins the refusal of a concurrency zone: the
// second request while the first is in flight.
func TestRefusalBytesConcurrency(t *testing.T) {
	h := &Handler{Headers: "both", Zones: map[string]*Zone{"pin_slots": {Key: "{http.request.header.X-Key}", MaxConcurrent: 1}}}
	var got string
	first := func() *http.Request { return keyRequest("c") }
	h.now = (&fakeClock{t: time.Unix(1_700_000_000, 0)}).Now
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	req := first()
	caddyhttp.NewTestReplacer(req)
	err := h.ServeHTTP(httptest.NewRecorder(), req, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		got = refusalTranscript(serve(h, first()))
		return nil
	}))
	const want = "429\nContent-Length: 160\nContent-Type: application/json\nRatelimit: \"pin_slots\";r=0\nRatelimit-Policy: \"pin_slots\";q=1;qu=\"concurrent-requests\"\nRetry-After: 1\nVary: Accept\nX-Ratelimit-Limit: 1\nX-Ratelimit-Remaining: 0\nX-Ratelimit-Reset: 1700000000\n\n{\"error\":\"rate limit exceeded\",\"message\":\"You have exceeded the rate limit of 1 requests at a time. Try again in 1 second.\",\"zone\":\"pin_slots\",\"retry_after\":1}\n"
	if err != nil || got != want {
		t.Errorf("error %v; got\n%s\nwant\n%s", err, got, want)
		t.Logf("GOLDEN %q", got)
	}
}

// refusalBody and problemBody are the bodies of a 429 as they were first
// written, with json.Marshal: the reference that the written ones match.
type refusalBody struct {
	Error      string `json:"error"`
	Message    string `json:"message"`
	Zone       string `json:"zone"`
	RetryAfter int64  `json:"retry_after"`
}

type problemBody struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	Zone       string `json:"zone"`
	RetryAfter int64  `json:"retry_after"`
}

// referenceLimitHeaders are the limit headers written with Header.Set and
// fmt, at now: the reference (the IETF fields' t is resetSeconds', which
// TestIETFConformance checks).
func referenceLimitHeaders(headers string, o outcome, now time.Time) http.Header {
	hdr := http.Header{}
	if headers == "" || headers == "x_ratelimit" || headers == "both" {
		hdr.Set("X-RateLimit-Limit", strconv.FormatInt(o.d.Limit, 10))
		hdr.Set("X-RateLimit-Remaining", strconv.FormatInt(o.d.Remaining, 10))
		hdr.Set("X-RateLimit-Reset", strconv.FormatInt(o.d.ResetUnix(), 10))
	}
	if headers == "ietf" || headers == "both" {
		p := o.req.Policy
		q := cmp.Or(o.d.Limit, p.Limit())
		if p.Algorithm == limiter.Concurrency {
			hdr.Set("RateLimit-Policy", fmt.Sprintf(`%q;q=%d;qu="concurrent-requests"`, o.zone, q))
		} else {
			hdr.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", o.zone, q, quotaWindow(p, q)))
		}
		state := fmt.Sprintf("%q;r=%d", o.zone, max(o.d.Remaining, 0))
		if t := resetSeconds(p, o.d, q, now); t >= 0 {
			state += fmt.Sprintf(";t=%d", t)
		}
		hdr.Set("RateLimit", state)
	}
	return hdr
}

// referenceRefusal is a refusal's body, Content-Type and Retry-After as
// they were first written.
func referenceRefusal(response string, o outcome) (body []byte, contentType string) {
	var secs string
	if o.retry == 1 {
		secs = "1 second"
	} else {
		secs = strconv.FormatInt(o.retry, 10) + " seconds"
	}
	message := fmt.Sprintf("You have exceeded the rate limit of %s. Try again in %s.", o.req.Policy, secs)
	var v any = refusalBody{Error: "rate limit exceeded", Message: message, Zone: o.zone, RetryAfter: o.retry}
	contentType = "application/json"
	if response == "problem" {
		v = problemBody{Type: "about:blank", Title: "Too Many Requests", Status: http.StatusTooManyRequests, Detail: message, Zone: o.zone, RetryAfter: o.retry}
		contentType = "application/problem+json"
	}
	body, _ = json.Marshal(v)
	return append(body, '\n'), contentType
}

// referencePolicies are policies of every algorithm and many periods.
func referencePolicies() []limiter.Policy {
	var ps []limiter.Policy
	periods := []time.Duration{time.Millisecond, 1500 * time.Microsecond, time.Second, 90 * time.Second, time.Minute,
		10 * time.Minute, time.Hour, 24 * time.Hour, 48 * time.Hour}
	for _, period := range periods {
		for _, n := range []int64{1, 2, 100} {
			ps = append(ps,
				limiter.Policy{Algorithm: limiter.TokenBucket, Rate: n, Period: period, Burst: n * 3},
				limiter.Policy{Algorithm: limiter.FixedWindow, Rate: n, Period: period, Burst: n},
				limiter.Policy{Algorithm: limiter.LeakyBucket, Rate: n, Period: period, Burst: n - 1})
		}
	}
	return append(ps, limiter.Policy{Algorithm: limiter.Concurrency, Slots: 1}, limiter.Policy{Algorithm: limiter.Concurrency, Slots: 7})
}

// TestResponsesAsReference: the headers and bodies, written from what is
// prepared per zone and policy, are those first written with fmt and
// json.Marshal, for every response and headers option, for the zone's own
// policy and for policies from placeholders (more than a zone keeps).
func TestResponsesAsReference(t *testing.T) {
	now := time.Now()
	for _, name := range []string{"api", "pin-window.a", "<odd&\"zone\">"} {
		z := &Zone{name: name}
		z.shown.init(name, limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Second, Burst: 1})
		for _, p := range referencePolicies() {
			for _, limit := range []int64{0, p.Limit(), p.Limit() + 5} {
				d := limiter.Decision{Limit: limit, Remaining: limit / 2, Reset: now.Add(90*time.Second + time.Second/2)}
				o := outcome{zone: name, req: limiter.Request{Policy: p}, d: d, z: z, text: z.shown.text(p)}
				for _, headers := range []string{"", "x_ratelimit", "ietf", "both", "none"} {
					h := &Handler{Headers: headers, now: func() time.Time { return now }}
					f := h.headerFields(http.Header{}, false)
					h.setLimitHeaders(&f, o)
					if want := referenceLimitHeaders(headers, o, now); !maps.EqualFunc(f.hdr, want, slices.Equal) {
						t.Fatalf("zone %q, %s, limit %d, headers %q:\n%v\nwant\n%v", name, p, limit, headers, f.hdr, want)
					}
				}
				for _, retry := range []int64{1, 2, 59, 100, 3600, 1 << 40} {
					o.retry = retry
					for _, response := range []string{"json", "problem"} {
						checkRefusal(t, &Handler{Response: response}, o)
					}
				}
			}
		}
	}
}

func checkRefusal(t *testing.T, h *Handler, o outcome) {
	t.Helper()
	w := httptest.NewRecorder()
	f := h.headerFields(w.Header(), true)
	if err := h.refuse(w, httptest.NewRequest(http.MethodGet, "/", nil), &f, o, nil, nil); err != nil {
		t.Fatal(err)
	}
	body, contentType := referenceRefusal(h.Response, o)
	want := http.Header{"Content-Type": {contentType}, "Content-Length": {strconv.Itoa(len(body))}, "Retry-After": {strconv.FormatInt(o.retry, 10)}}
	if w.Code != http.StatusTooManyRequests || w.Body.String() != string(body) || !maps.EqualFunc(w.Header(), want, slices.Equal) {
		t.Fatalf("%s, %s, retry %d: %d %v\n%s\nwant %v\n%s", h.Response, o.req.Policy, o.retry, w.Code, w.Header(), w.Body, want, body)
	}
}

// TestHeaderNamesCanonical: the header names set as they are are those
// Header.Set would write.
func TestHeaderNamesCanonical(t *testing.T) {
	for _, k := range []string{hdrLimit, hdrRemaining, hdrReset, hdrPolicy, hdrState, hdrRetryAfter, hdrContentType, hdrContentLength} {
		if c := http.CanonicalHeaderKey(k); c != k {
			t.Errorf("%q is written %q", k, c)
		}
	}
}

// TestJitterProportional: jitter 0.5 adds 0 to half the wait, at random.
func TestJitterProportional(t *testing.T) {
	h := &Handler{Jitter: 0.5, Zones: map[string]*Zone{"j": {Key: "k", MaxEvents: 1, Window: caddy.Duration(time.Minute)}}}
	clock := &fakeClock{t: time.Now()}
	h.now = clock.Now
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 200, "")
	seen := map[int]bool{}
	for range 200 {
		w := serve(h, clientRequest("GET", "/", "10.0.0.1"))
		n, err := strconv.Atoi(w.Header().Get("Retry-After"))
		if w.Code != 429 || err != nil || n < 60 || n > 90 {
			t.Fatalf("status %d, Retry-After %q; want 429 and 60 to 90", w.Code, w.Header().Get("Retry-After"))
		}
		seen[n] = true
	}
	if len(seen) < 10 {
		t.Fatalf("Retry-After took %d values in 200 refusals: %v", len(seen), seen)
	}
}

// TestLayeredRefusalShowsNoQuotaLeft: a 429 of an inner handler carries
// no limit header of an outer one that says quota is left.
func TestLayeredRefusalShowsNoQuotaLeft(t *testing.T) {
	outer := &Handler{Headers: "both", Zones: map[string]*Zone{"site_ip": {Key: "k", Rate: "30r/m"}}}
	inner := &Handler{Zones: map[string]*Zone{"login": {Key: "k", Rate: "1r/m"}}}
	for _, h := range []*Handler{outer, inner} {
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
	}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return inner.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(http.StatusOK)
			return nil
		}))
	})
	serveWith(outer, httptest.NewRequest(http.MethodGet, "/", nil), next)
	w := serveWith(outer, httptest.NewRequest(http.MethodGet, "/", nil), next)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("second request: %d; want 429 from the inner handler", w.Code)
	}
	for _, h := range []string{"Ratelimit", "Ratelimit-Policy"} {
		if v := w.Header().Get(h); v != "" {
			t.Errorf("the inner refusal carries the outer handler's %s: %q", h, v)
		}
	}
	if got := w.Header().Get("X-Ratelimit-Remaining"); got != "0" {
		t.Errorf("X-RateLimit-Remaining %q; want 0 (the refusing zone's)", got)
	}
}

// TestPlaceholdersLayered: in a request with Caddy's vars, the
// {http.rate_limit.*} placeholders show the decision of the last handler
// that decided (an inner one's over an outer one's), and read after the
// handlers return; a refusal's exceeded and retry_after too.
func TestPlaceholdersLayered(t *testing.T) {
	outer := &Handler{Zones: map[string]*Zone{"ph_outer": {Key: "{http.request.header.X-Key}", Rate: "100r/m"}}}
	inner := &Handler{Zones: map[string]*Zone{"ph_inner": {Key: "{http.request.header.X-Key}", Rate: "1r/m"}}}
	for _, h := range []*Handler{outer, inner} {
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []string{"ph_inner 1 0 false 0", "ph_inner 1 0 true 60"} {
		r := keyRequest("layered")
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
		repl := caddyhttp.NewTestReplacer(r)
		w := httptest.NewRecorder()
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			return inner.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		})
		_ = outer.ServeHTTP(w, r, next)
		got := repl.ReplaceAll("{http.rate_limit.zone} {http.rate_limit.limit} {http.rate_limit.remaining} {http.rate_limit.exceeded} {http.rate_limit.retry_after}", "")
		if got != want {
			t.Errorf("request %d: placeholders %q; want %q", i, got, want)
		}
		if reset := repl.ReplaceAll("{http.rate_limit.reset}", ""); len(reset) != 10 {
			t.Errorf("request %d: reset %q; want Unix seconds", i, reset)
		}
	}
}

// TestPlaceholdersReadAfterLaterRequests: a request's {http.rate_limit.*}
// placeholders, read after its handler returned (as Caddy's access log
// reads them), show its own decision after other requests reused the
// handler's scratch (and the room of its verdict's decisions).
func TestPlaceholdersReadAfterLaterRequests(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"ph_later": {Key: "{http.request.header.X-Key}", Rate: "5r/m"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	serveVars := func(key string) func(string) string {
		r := keyRequest(key)
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
		repl := caddyhttp.NewTestReplacer(r)
		_ = h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		return func(s string) string { return repl.ReplaceAll(s, "") }
	}
	first := serveVars("first")
	for i := range 20 {
		serveVars("other" + strconv.Itoa(i%2))
	}
	const fields = "{http.rate_limit.zone} {http.rate_limit.limit} {http.rate_limit.remaining} {http.rate_limit.exceeded} {http.rate_limit.retry_after}"
	if got, want := first(fields), "ph_later 5 4 false 0"; got != want {
		t.Errorf("the first request's placeholders, read after 20 more: %q; want %q", got, want)
	}
}
