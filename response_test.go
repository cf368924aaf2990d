package ratelimit

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
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

// TestIETFHeadersConcurrency: a concurrency zone has no window, so no
// policy; its state counts the free slots.
func TestIETFHeadersConcurrency(t *testing.T) {
	h := &Handler{Headers: "ietf", Zones: map[string]*Zone{"slots": {Key: "k", MaxConcurrent: 3}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	w := serve(h, httptest.NewRequest(http.MethodGet, "/", nil))
	if p := w.Header().Get("RateLimit-Policy"); p != "" {
		t.Fatalf("RateLimit-Policy %q for a concurrency zone; want none", p)
	}
	if s := parseIETFItem(t, "RateLimit", w.Header().Get("RateLimit")); s.name != "slots" || s.params["r"] != 2 {
		t.Fatalf("RateLimit %q; want \"slots\";r=2", w.Header().Get("RateLimit"))
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
	huge := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: limiter.MaxPeriod, Burst: 1 << 40}
	if w := quotaWindow(huge, huge.Limit()); w != math.MaxInt64/int64(time.Second) {
		t.Fatalf("a refill beyond 2^64ns: w=%d; want the cap", w)
	}
}
