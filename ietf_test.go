package ratelimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

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
