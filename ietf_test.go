package ratelimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dunglas/httpsfv"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// ietfFields are RateLimit-Policy and RateLimit as a Structured Field
// parser (RFC 9651) reads them, checked against the rules of
// draft-ietf-httpapi-ratelimit-headers-10.
type ietfFields struct {
	policy map[string]*httpsfv.Params // by policy name
	state  map[string]*httpsfv.Params
}

// parseIETF parses and checks the IETF fields of hdr: both are Lists of
// Items whose value is a String; a policy has q (an Integer >= 0), w (if
// any, an Integer > 0), qu (if any, a registered unit); a state names a
// policy sent, and has r (an Integer >= 0) and t (if any, an Integer >=
// 0). No pk: a client key is never sent, not even as a digest.
func parseIETF(t *testing.T, hdr http.Header) ietfFields {
	t.Helper()
	f := ietfFields{policy: map[string]*httpsfv.Params{}, state: map[string]*httpsfv.Params{}}
	for _, field := range []string{"RateLimit-Policy", "RateLimit"} {
		list, err := httpsfv.UnmarshalList(hdr.Values(field))
		if err != nil || len(list) == 0 {
			t.Fatalf("%s %q: not a non-empty List: %v", field, hdr.Values(field), err)
		}
		for _, m := range list {
			it, ok := m.(httpsfv.Item)
			name, isString := it.Value.(string)
			if !ok || !isString {
				t.Fatalf("%s %q: member %v is not an Item whose value is a String", field, hdr.Values(field), m)
			}
			if field == "RateLimit-Policy" {
				checkPolicyItem(t, hdr.Get(field), it.Params)
				f.policy[name] = it.Params
			} else {
				checkStateItem(t, hdr.Get(field), it.Params)
				f.state[name] = it.Params
			}
		}
	}
	for name := range f.state {
		if f.policy[name] == nil {
			t.Fatalf("RateLimit names %q, which RateLimit-Policy does not", name)
		}
	}
	return f
}

func checkPolicyItem(t *testing.T, field string, p *httpsfv.Params) {
	t.Helper()
	if q, ok := intParam(p, "q"); !ok || q < 0 {
		t.Fatalf("RateLimit-Policy %q: q must be an Integer >= 0", field)
	}
	if _, there := p.Get("w"); there {
		if w, ok := intParam(p, "w"); !ok || w <= 0 {
			t.Fatalf("RateLimit-Policy %q: w must be an Integer > 0", field)
		}
	}
	if qu, there := p.Get("qu"); there && !slices.Contains([]any{"requests", "content-bytes", "concurrent-requests"}, qu) {
		t.Fatalf("RateLimit-Policy %q: qu %v is not a registered quota unit", field, qu)
	}
	checkOnly(t, "RateLimit-Policy", field, p, "q", "w", "qu")
}

func checkStateItem(t *testing.T, field string, p *httpsfv.Params) {
	t.Helper()
	if r, ok := intParam(p, "r"); !ok || r < 0 {
		t.Fatalf("RateLimit %q: r is required, an Integer >= 0", field)
	}
	if _, there := p.Get("t"); there {
		if v, ok := intParam(p, "t"); !ok || v < 0 {
			t.Fatalf("RateLimit %q: t must be an Integer >= 0", field)
		}
	}
	checkOnly(t, "RateLimit", field, p, "r", "t")
}

// checkOnly: the parameters sent are those the draft defines that this
// module writes; above all, no pk.
func checkOnly(t *testing.T, name, field string, p *httpsfv.Params, allowed ...string) {
	t.Helper()
	for _, k := range p.Names() {
		if !slices.Contains(allowed, k) {
			t.Fatalf("%s %q: parameter %q", name, field, k)
		}
	}
}

func intParam(p *httpsfv.Params, k string) (int64, bool) {
	v, ok := p.Get(k)
	n, isInt := v.(int64)
	return n, ok && isInt
}

// TestIETFConformance: for every algorithm, every response (allowed and
// refused) carries fields that parse and keep the draft's rules; t is the
// seconds until more quota is available (the next unit of a bucket, not a
// full bucket), never after Retry-After; and when t has passed, at least
// one unit has come back. want are the first responses' (q, w, r, t); -1
// for a parameter left out.
func TestIETFConformance(t *testing.T) {
	cases := map[string]struct {
		zone *Zone
		want [][4]int64
	}{
		"token bucket 1r/10s burst 5": {&Zone{Rate: "1r/10s", Burst: "5"}, [][4]int64{{5, 50, 4, 10}, {5, 50, 3, 10}}},
		"token bucket 100r/m":         {&Zone{Rate: "100r/m"}, [][4]int64{{100, 60, 99, 1}, {100, 60, 98, 1}, {100, 60, 97, 1}}},
		"token bucket, cost 2":        {&Zone{Rate: "1r/s", Burst: "4", Cost: "2"}, [][4]int64{{4, 4, 2, 1}, {4, 4, 0, 1}}},
		"fixed window 10r/m":          {&Zone{Rate: "10r/m", Algorithm: "fixed_window"}, [][4]int64{{10, 60, 9, 40}, {10, 60, 8, 40}}},
		"sliding window log 2r/10s":   {&Zone{Rate: "2r/10s", Algorithm: "sliding_window_log"}, [][4]int64{{2, 10, 1, 10}, {2, 10, 0, 10}}},
		"sliding window counter":      {&Zone{Rate: "5r/h", Algorithm: "sliding_window_counter"}, [][4]int64{{5, 3600, 4, 6400}}},
		"leaky bucket 1r/s burst 5":   {&Zone{Rate: "1r/s", Burst: "5", Algorithm: "leaky_bucket", NoDelay: true}, [][4]int64{{6, 6, 5, 1}, {6, 6, 4, 1}, {6, 6, 3, 1}}},
		"leaky bucket 1r/m":           {&Zone{Rate: "1r/m", Algorithm: "leaky_bucket"}, [][4]int64{{1, 60, 0, 60}, {1, 60, 0, 60}}},
		"events in a window":          {&Zone{MaxEvents: 2, Window: caddy.Duration(90 * time.Second)}, [][4]int64{{2, 90, 1, 90}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			c.zone.Key = "{http.request.header.X-Key}"
			h := &Handler{Headers: "ietf", Zones: map[string]*Zone{"api": c.zone}}
			clock := &fakeClock{t: time.Unix(1_700_000_000, 250_000_000)}
			h.now = clock.Now
			if err := provision(t, h); err != nil {
				t.Fatal(err)
			}
			for i := range 12 {
				w := serve(h, keyRequest("client"))
				f := parseIETF(t, w.Header())
				p, s := f.policy["api"], f.state["api"]
				got := [4]int64{param(p, "q"), param(p, "w"), param(s, "r"), param(s, "t")}
				if i < len(c.want) && got != c.want[i] {
					t.Fatalf("request %d: %q, %q; want (q, w, r, t) %v", i, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), c.want[i])
				}
				checkAgainstRetryAfter(t, w, got)
			}
			checkQuotaComesBack(t, h, clock, c.want[0][0]-c.want[0][2])
		})
	}
}

func param(p *httpsfv.Params, k string) int64 {
	if n, ok := intParam(p, k); ok {
		return n
	}
	return -1
}

// checkAgainstRetryAfter: r <= q, and Retry-After, if any, is no earlier
// than t.
func checkAgainstRetryAfter(t *testing.T, w *httptest.ResponseRecorder, got [4]int64) {
	t.Helper()
	if got[2] > got[0] {
		t.Fatalf("r=%d over q=%d", got[2], got[0])
	}
	if ra := w.Header().Get("Retry-After"); ra != "" {
		n, err := strconv.ParseInt(ra, 10, 64)
		if err != nil || got[3] < 0 || n < got[3] {
			t.Fatalf("Retry-After %q, RateLimit %q: want t, and Retry-After no earlier", ra, w.Header().Get("RateLimit"))
		}
	}
}

// checkQuotaComesBack: t seconds after a response, more quota is there
// than it left: at least one unit more, which a request of the cost
// takes.
func checkQuotaComesBack(t *testing.T, h *Handler, clock *fakeClock, cost int64) {
	t.Helper()
	w := serve(h, keyRequest("later"))
	s := parseIETF(t, w.Header()).state["api"]
	r, wait := param(s, "r"), param(s, "t")
	if wait < 0 {
		t.Fatalf("RateLimit %q: no t while quota is used", w.Header().Get("RateLimit"))
	}
	clock.Advance(time.Duration(wait) * time.Second)
	w = serve(h, keyRequest("later"))
	if after := param(parseIETF(t, w.Header()).state["api"], "r"); w.Code != http.StatusOK || after < r+1-cost {
		t.Fatalf("%ds after r=%d: %d, RateLimit %q; want the unit back", wait, r, w.Code, w.Header().Get("RateLimit"))
	}
}

// TestIETFConcurrency: a concurrency limit's policy has qu
// concurrent-requests and no window (w is never 0); its state no t, since
// no one can tell when a request in flight ends.
func TestIETFConcurrency(t *testing.T) {
	h := &Handler{Headers: "ietf", Zones: map[string]*Zone{"slots": {Key: "k", MaxConcurrent: 1}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	var inner *httptest.ResponseRecorder
	outer := serveWith(h, httptest.NewRequest(http.MethodGet, "/", nil), caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		inner = serve(h, httptest.NewRequest(http.MethodGet, "/", nil))
		return nil
	}))
	for _, w := range []*httptest.ResponseRecorder{outer, inner} {
		f := parseIETF(t, w.Header())
		p, s := f.policy["slots"], f.state["slots"]
		if qu, _ := p.Get("qu"); qu != "concurrent-requests" || param(p, "q") != 1 || param(p, "w") != -1 || param(s, "r") != 0 || param(s, "t") != -1 {
			t.Fatalf("%d: RateLimit-Policy %q, RateLimit %q; want q=1;qu=\"concurrent-requests\" and r=0 alone",
				w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
		}
	}
	if inner.Code != http.StatusTooManyRequests {
		t.Fatalf("second request in flight: %d; want 429", inner.Code)
	}
}

// TestIETFZoneNames: a zone's name is sent as a String, and
// violated-policies names it as RateLimit-Policy does.
func TestIETFZoneNames(t *testing.T) {
	for _, name := range []string{"api", "pin-window.a", "Z_9", "-.-"} {
		h := &Handler{Headers: "ietf", Zones: map[string]*Zone{name: {Key: "k", Rate: "1r/m"}}}
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		serve(h, httptest.NewRequest(http.MethodGet, "/", nil))
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Accept", "application/problem+json")
		w := serve(h, r)
		f := parseIETF(t, w.Header())
		var body struct {
			Violated []string `json:"violated-policies"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || len(body.Violated) != 1 || f.policy[body.Violated[0]] == nil || f.state[body.Violated[0]] == nil {
			t.Fatalf("zone %q: RateLimit-Policy %q, RateLimit %q, body %s", name, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), w.Body)
		}
	}
}

// TestIETFNegativeRemaining: r is never negative, though a decision's
// remaining may be (a storage fleet's count in debt).
func TestIETFNegativeRemaining(t *testing.T) {
	z := &Zone{name: "api"}
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Second, Burst: 5}
	z.shown.init("api", p)
	d := limiter.Decision{Allowed: true, Limit: 5, Remaining: -3, Reset: time.Now().Add(8 * time.Second)}
	h := &Handler{Headers: "ietf"}
	f := h.headerFields(http.Header{}, false)
	h.setLimitHeaders(&f, outcome{zone: "api", req: limiter.Request{Policy: p}, d: d, z: z, text: z.shown.text(p)})
	if r := param(parseIETF(t, f.hdr).state["api"], "r"); r != 0 {
		t.Fatalf("RateLimit %q; want r=0", f.hdr.Get("Ratelimit"))
	}
}

// TestIETFResetInStoreClock: t is counted on the clock that decided (a
// Redis node's, Decision.At), as Reset is: a node whose clock is 2 s
// behind the handler's, or a reply that took 2 s, does not take 2 s off t.
func TestIETFResetInStoreClock(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		p    limiter.Policy
		d    limiter.Decision
		want string
	}{
		{limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 10, Period: time.Minute},
			limiter.Decision{Allowed: true, Limit: 10, Remaining: 4, Reset: now.Add(8 * time.Second), At: now.Add(-2 * time.Second)}, `"api";r=4;t=10`},
		{limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: 4 * time.Second, Burst: 5},
			limiter.Decision{Allowed: true, Limit: 5, Remaining: 3, Reset: now.Add(5 * time.Second), At: now.Add(-2 * time.Second)}, `"api";r=3;t=3`},
		{limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 10, Period: time.Minute},
			limiter.Decision{Allowed: true, Limit: 10, Remaining: 4, Reset: now.Add(8 * time.Second)}, `"api";r=4;t=8`}, // no At: the handler's clock
	} {
		z := &Zone{name: "api"}
		z.shown.init("api", c.p)
		h := &Handler{Headers: "ietf", now: func() time.Time { return now }}
		f := h.headerFields(http.Header{}, false)
		h.setLimitHeaders(&f, outcome{zone: "api", req: limiter.Request{Policy: c.p}, d: c.d, z: z, text: z.shown.text(c.p)})
		if got := f.hdr.Get("Ratelimit"); got != c.want {
			t.Errorf("%s, decided at %v: RateLimit %q; want %q", c.p, c.d.At, got, c.want)
		}
	}
}

// quotaExceeded is the draft's quota-exceeded problem details, with this
// module's extension members.
type quotaExceeded struct {
	Type     string   `json:"type"`
	Title    string   `json:"title"`
	Status   int      `json:"status"`
	Detail   string   `json:"detail"`
	Violated []string `json:"violated-policies"`
	Zone     string   `json:"zone"`
	Retry    *int64   `json:"retry_after"`
}

// TestIETFProblemBody: with the IETF fields, a refusal's body is the
// draft's quota-exceeded problem type when the client accepts
// application/problem+json, naming every enforced zone that refused;
// otherwise, and in the other header modes, the body the Response option
// chooses (about:blank for response problem). A body chosen by Accept is
// sent with Vary: Accept.
func TestIETFProblemBody(t *testing.T) {
	zones := func() map[string]*Zone {
		return map[string]*Zone{"per_min": {Key: "k", Rate: "1r/m"}, "per_hour": {Key: "k", Rate: "1r/h"},
			"wide": {Key: "k", Rate: "100r/m"}, "dry": {Key: "k", Rate: "1r/d", DryRun: true}}
	}
	cases := []struct {
		name, headers, response, accept string
		quota                           bool
	}{
		{"ietf, accepts problem", "ietf", "", "application/problem+json", true},
		{"both, accepts problem among others", "both", "json", "text/html, application/problem+json;q=0.5", true},
		{"ietf, problem refused by q=0", "ietf", "", "application/problem+json;q=0", false},
		{"ietf, any type", "ietf", "", "*/*", false},
		{"ietf, response problem", "ietf", "problem", "", false},
		{"ietf, response problem, accepts problem", "ietf", "problem", "application/problem+json", true},
		{"x_ratelimit, accepts problem", "x_ratelimit", "", "application/problem+json", false},
		{"x_ratelimit, response problem", "x_ratelimit", "problem", "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := &Handler{Headers: c.headers, Response: c.response, Zones: zones()}
			if err := provision(t, h); err != nil {
				t.Fatal(err)
			}
			serve(h, httptest.NewRequest(http.MethodGet, "/", nil))
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			if c.accept != "" {
				r.Header.Set("Accept", c.accept)
			}
			w := serve(h, r)
			var b quotaExceeded
			if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || w.Code != http.StatusTooManyRequests {
				t.Fatalf("%d %s: %v", w.Code, w.Body, err)
			}
			isQuota := b.Type == "https://iana.org/assignments/http-problem-types#quota-exceeded"
			if isQuota != c.quota {
				t.Fatalf("body %s; want quota-exceeded: %t", w.Body, c.quota)
			}
			negotiated := c.headers == "ietf" || c.headers == "both"
			if vary := slices.Contains(w.Header().Values("Vary"), "Accept"); vary != negotiated {
				t.Fatalf("Vary %q; want Accept: %t", w.Header().Values("Vary"), negotiated)
			}
			if !c.quota {
				if problem := c.response == "problem"; problem != (b.Type == "about:blank") {
					t.Fatalf("body %s; want about:blank: %t", w.Body, problem)
				}
				return
			}
			if w.Header().Get("Content-Type") != "application/problem+json" || b.Title != "Quota Exceeded" || b.Status != 429 ||
				b.Detail == "" || !slices.Equal(b.Violated, []string{"per_hour", "per_min"}) || b.Zone != "per_hour" || b.Retry == nil {
				t.Fatalf("%v %s", w.Header(), w.Body)
			}
			if ra, _ := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64); ra != *b.Retry {
				t.Fatalf("retry_after %d, Retry-After %d", *b.Retry, ra)
			}
		})
	}
}

// TestIETFProblemBodyImpossible: a request that no wait lets pass gets
// the quota-exceeded type too, with its cost and the limit, and no wait.
func TestIETFProblemBodyImpossible(t *testing.T) {
	h := &Handler{Headers: "ietf", Zones: map[string]*Zone{"api": {Key: "k", Rate: "10r/s", Cost: "{http.request.header.X-Cost}", DefaultCost: 1}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Accept", "application/problem+json")
	r.Header.Set("X-Cost", "1000")
	w := serve(h, r)
	var b struct {
		quotaExceeded
		Cost, Limit int64
	}
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || w.Code != 429 || w.Header().Get("Retry-After") != "" ||
		b.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || !slices.Equal(b.Violated, []string{"api"}) ||
		b.Retry != nil || b.Cost != 1000 || b.Limit != 10 {
		t.Fatalf("%d %v %s (%v)", w.Code, w.Header(), w.Body, err)
	}
}
