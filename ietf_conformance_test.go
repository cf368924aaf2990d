package ratelimit

// The conformance of headers ietf (and both) to
// draft-ietf-httpapi-ratelimit-headers-10, for every algorithm: the
// fields as a Structured Field parser (RFC 9651) reads them, checked
// against the draft's rules, and a refusal's body against its
// quota-exceeded problem type.

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
)

// ietfFields are RateLimit-Policy and RateLimit as a Structured Field
// parser reads them.
type ietfFields struct {
	policy map[string]*httpsfv.Params // by policy name
	state  map[string]*httpsfv.Params
}

// parseIETF parses and checks the IETF fields of hdr: both are non-empty
// Lists of Items whose value is a String, each name once; a policy has q
// (an Integer >= 0), w (if any, an Integer > 0), qu (if any, a
// registered unit, a String); a state names a policy sent, and has r (an
// Integer >= 0) and t (if any, an Integer >= 0). No pk: a client key is
// never sent, not even as a digest; no other parameter.
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
			items, check := f.state, checkStateItem
			if field == "RateLimit-Policy" {
				items, check = f.policy, checkPolicyItem
			}
			if items[name] != nil {
				t.Fatalf("%s %q: %q twice", field, hdr.Values(field), name)
			}
			check(t, hdr.Get(field), it.Params)
			items[name] = it.Params
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

func param(p *httpsfv.Params, k string) int64 {
	if n, ok := intParam(p, k); ok {
		return n
	}
	return -1
}

// quotaExceededType is the draft's problem type URI for a refusal.
const quotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// checkQuotaExceeded checks a refusal to a client that accepts
// application/problem+json against the draft's quota-exceeded problem
// type (RFC 9457): its Content-Type, type, a title (a string), status
// 429, and violated-policies, an array of strings that names the policy
// of the RateLimit field; and Vary: Accept, since the body depends on it.
func checkQuotaExceeded(t *testing.T, w *httptest.ResponseRecorder, f ietfFields) {
	t.Helper()
	var b map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || w.Header().Get("Content-Type") != "application/problem+json" ||
		!slices.Contains(w.Header().Values("Vary"), "Accept") {
		t.Fatalf("%v %s: not problem details that vary with Accept (%v)", w.Header(), w.Body, err)
	}
	_, title := b["title"].(string)
	if b["type"] != quotaExceededType || !title || b["status"] != float64(http.StatusTooManyRequests) {
		t.Fatalf("%s: not the quota-exceeded problem type", w.Body)
	}
	list, _ := b["violated-policies"].([]any)
	names := make([]string, 0, len(list))
	for _, v := range list {
		if s, ok := v.(string); ok {
			names = append(names, s)
		}
	}
	if len(names) == 0 || len(names) != len(list) {
		t.Fatalf("%s: violated-policies is not a non-empty array of strings", w.Body)
	}
	for name := range f.state {
		if !slices.Contains(names, name) {
			t.Fatalf("%s: violated-policies does not name %q, the policy of RateLimit %q", w.Body, name, w.Header().Get("RateLimit"))
		}
	}
}

// TestIETFConformance: for every algorithm (concurrency:
// TestIETFConcurrency), with headers ietf and both, every response
// (allowed and refused, to a client that accepts problem details) carries
// fields that parse and keep the draft's rules, and every refusal's body
// is the draft's problem type; t is sent while quota is used, is the
// seconds until more quota is available (the next unit of a bucket, not a
// full bucket), never after Retry-After; and when t has passed, at least
// one unit has come back. want are the first responses' (q, w, r, t); -1
// for a parameter left out.
func TestIETFConformance(t *testing.T) {
	ban := &BanConfig{After: 1, Within: caddy.Duration(time.Minute), For: caddy.Duration(time.Hour)}
	cases := map[string]struct {
		zone    func() *Zone
		want    [][4]int64
		refuses bool
	}{
		"token bucket 1r/10s burst 5": {func() *Zone { return &Zone{Rate: "1r/10s", Burst: "5"} }, [][4]int64{{5, 50, 4, 10}, {5, 50, 3, 10}}, true},
		"token bucket 100r/m":         {func() *Zone { return &Zone{Rate: "100r/m"} }, [][4]int64{{100, 60, 99, 1}, {100, 60, 98, 1}, {100, 60, 97, 1}}, false},
		"token bucket, cost 2":        {func() *Zone { return &Zone{Rate: "1r/s", Burst: "4", Cost: "2"} }, [][4]int64{{4, 4, 2, 1}, {4, 4, 0, 1}, {4, 4, 0, 1}}, true},
		"token bucket, ban":           {func() *Zone { return &Zone{Rate: "1r/m", Ban: ban} }, [][4]int64{{1, 60, 0, 60}, {1, 60, 0, 3600}}, true},
		"fixed window 10r/m":          {func() *Zone { return &Zone{Rate: "10r/m", Algorithm: "fixed_window"} }, [][4]int64{{10, 60, 9, 40}, {10, 60, 8, 40}}, true},
		"sliding window log 2r/10s":   {func() *Zone { return &Zone{Rate: "2r/10s", Algorithm: "sliding_window_log"} }, [][4]int64{{2, 10, 1, 10}, {2, 10, 0, 10}, {2, 10, 0, 10}}, true},
		"sliding window counter":      {func() *Zone { return &Zone{Rate: "5r/h", Algorithm: "sliding_window_counter"} }, [][4]int64{{5, 3600, 4, 6400}}, true},
		"leaky bucket 1r/s burst 5":   {func() *Zone { return &Zone{Rate: "1r/s", Burst: "5", Algorithm: "leaky_bucket", NoDelay: true} }, [][4]int64{{6, 6, 5, 1}, {6, 6, 4, 1}, {6, 6, 3, 1}}, true},
		"leaky bucket 1r/m":           {func() *Zone { return &Zone{Rate: "1r/m", Algorithm: "leaky_bucket"} }, [][4]int64{{1, 60, 0, 60}, {1, 60, 0, 60}}, true},
		"events in a window":          {func() *Zone { return &Zone{MaxEvents: 2, Window: caddy.Duration(90 * time.Second)} }, [][4]int64{{2, 90, 1, 90}, {2, 90, 0, 90}, {2, 90, 0, 90}}, true},
	}
	for name, c := range cases {
		for _, headers := range []string{"ietf", "both"} {
			t.Run(name+", "+headers, func(t *testing.T) {
				zone := c.zone()
				zone.Key = "{http.request.header.X-Key}"
				h := &Handler{Headers: headers, Response: "json", Zones: map[string]*Zone{"api": zone}}
				clock := &fakeClock{t: time.Unix(1_700_000_000, 250_000_000)}
				h.now = clock.Now
				if err := provision(t, h); err != nil {
					t.Fatal(err)
				}
				refused := false
				for i := range 12 {
					w := serve(h, problemRequest("client"))
					got := checkResponse(t, w)
					if i < len(c.want) && got != c.want[i] {
						t.Fatalf("request %d: %q, %q; want (q, w, r, t) %v", i, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), c.want[i])
					}
					refused = refused || w.Code == http.StatusTooManyRequests
				}
				if refused != c.refuses {
					t.Fatalf("refused: %t; want %t", refused, c.refuses)
				}
				checkQuotaComesBack(t, h, clock, c.want[0][0]-c.want[0][2])
			})
		}
	}
}

// problemRequest is a request of client key, that accepts problem details.
func problemRequest(key string) *http.Request {
	r := keyRequest(key)
	r.Header.Set("Accept", "application/problem+json")
	return r
}

// checkResponse checks w's fields, and its body if it is a refusal, and
// returns the (q, w, r, t) of the policy "api".
func checkResponse(t *testing.T, w *httptest.ResponseRecorder) [4]int64 {
	t.Helper()
	f := parseIETF(t, w.Header())
	p, s := f.policy["api"], f.state["api"]
	got := [4]int64{param(p, "q"), param(p, "w"), param(s, "r"), param(s, "t")}
	if got[2] > got[0] || (got[3] < 0) != (got[2] == got[0]) {
		t.Fatalf("RateLimit-Policy %q, RateLimit %q: want r <= q, and t while quota is used", w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
	}
	if ra := w.Header().Get("Retry-After"); ra != "" {
		if n, err := strconv.ParseInt(ra, 10, 64); err != nil || n < got[3] {
			t.Fatalf("Retry-After %q, RateLimit %q: Retry-After is earlier than t", ra, w.Header().Get("RateLimit"))
		}
	}
	if lim := w.Header().Get("X-RateLimit-Limit"); lim != "" && (lim != strconv.FormatInt(got[0], 10) ||
		w.Header().Get("X-RateLimit-Remaining") != strconv.FormatInt(got[2], 10)) {
		t.Fatalf("X-RateLimit-Limit %q, -Remaining %q; RateLimit-Policy %q, RateLimit %q disagree", lim,
			w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
	}
	if w.Code == http.StatusTooManyRequests {
		checkQuotaExceeded(t, w, f)
	}
	return got
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
// no one can tell when a request in flight ends; its refusal's body is
// the draft's problem type, as the other algorithms'.
func TestIETFConcurrency(t *testing.T) {
	for _, headers := range []string{"ietf", "both"} {
		h := &Handler{Headers: headers, Zones: map[string]*Zone{"slots": {Key: "k", MaxConcurrent: 1}}}
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		var inner *httptest.ResponseRecorder
		outer := serveWith(h, problemRequest("c"), caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			inner = serve(h, problemRequest("c"))
			return nil
		}))
		for _, w := range []*httptest.ResponseRecorder{outer, inner} {
			f := parseIETF(t, w.Header())
			p, s := f.policy["slots"], f.state["slots"]
			if qu, _ := p.Get("qu"); qu != "concurrent-requests" || param(p, "q") != 1 || param(p, "w") != -1 || param(s, "r") != 0 || param(s, "t") != -1 {
				t.Fatalf("%s, %d: RateLimit-Policy %q, RateLimit %q; want q=1;qu=\"concurrent-requests\" and r=0 alone",
					headers, w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
			}
		}
		if inner.Code != http.StatusTooManyRequests {
			t.Fatalf("%s, second request in flight: %d; want 429", headers, inner.Code)
		}
		checkQuotaExceeded(t, inner, parseIETF(t, inner.Header()))
	}
}
