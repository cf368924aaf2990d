package ratelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/crlconfigs"
)

// The configurations of caddy-ratelimit (internal/crlconfigs: its README's
// examples and its tests' configurations, verbatim), with the arguments
// its tests give their formats.
var (
	crlTestCaddyfile     = fmt.Sprintf(crlconfigs.TestCaddyfile, 60, 10)
	crlTestRateLimits    = fmt.Sprintf(crlconfigs.TestRateLimits, 60, 10)
	crlTestDistinctZones = fmt.Sprintf(crlconfigs.TestDistinctZones, 10, 10)
	crlTestMetrics       = fmt.Sprintf(crlconfigs.TestMetrics, 10, 2)
	// Its README's examples without the one line we refuse (distributed).
	crlReadmeCaddyfileLocal = strings.Replace(crlconfigs.ReadmeCaddyfile, "\tdistributed\n", "", 1)
	crlReadmeJSONLocal      = strings.Replace(crlconfigs.ReadmeJSON, "\"distributed\": {},\n", "", 1)
)

// crlSite makes a whole Caddyfile of a bare directive (the README's
// snippets).
func crlSite(directive string) string { return ":80\n\n" + directive + "\nrespond ok\n" }

// crlHandlerConfig makes a whole JSON config of a bare handler.
func crlHandlerConfig(handler string) string {
	return `{"apps": {"http": {"servers": {"s": {"listen": [":80"], "routes": [{"handle": [` + handler + `]}]}}}}}`
}

// loadConfig loads a whole config as Caddy would (adapting a Caddyfile
// first), provisioning every module, without starting it.
func loadConfig(t *testing.T, format, src string) error {
	t.Helper()
	if format == "caddyfile" {
		out, err := adapt(t, src)
		if err != nil {
			return err
		}
		src = out
	}
	var cfg caddy.Config
	if err := json.Unmarshal([]byte(src), &cfg); err != nil {
		return err
	}
	return caddy.Validate(&cfg)
}

func TestCaddyRateLimitConfigsLoad(t *testing.T) {
	distributed := []string{"caddy-ratelimit's distributed rate limiting", "redis {\n\t\taddresses <host:port>\n\t}"}
	cases := []struct {
		name, format, src string
		wantErr           []string // nil: it loads
	}{
		{"README Caddyfile example", "caddyfile", crlconfigs.ReadmeCaddyfile, append(distributed, "at Caddyfile:4")},
		{"README Caddyfile example without distributed", "caddyfile", crlReadmeCaddyfileLocal, nil},
		{"README JSON example", "json", crlconfigs.ReadmeJSON, append(distributed, `in JSON: "redis": {"addresses":["<host:port>"]}`)},
		{"README JSON example without distributed", "json", crlReadmeJSONLocal, nil},
		{"README order option", "caddyfile", crlconfigs.ReadmeOrder + crlSite(crlconfigs.ReadmePrefixCaddyfile), nil},
		{"README prefix Caddyfile", "caddyfile", crlSite(crlconfigs.ReadmePrefixCaddyfile), nil},
		{"README prefix JSON", "json", crlHandlerConfig(crlconfigs.ReadmePrefixJSON), nil},
		{"caddyfile_test.go", "caddyfile", crlTestCaddyfile, nil},
		{"handler_test.go TestRateLimits", "json", crlTestRateLimits, nil},
		{"handler_test.go TestDistinctZonesAndKeys", "json", crlTestDistinctZones, nil},
		{"metrics_test.go TestMetrics", "json", crlTestMetrics, nil},
		{"distributed_test.go TestDistributed", "json", fmt.Sprintf(crlconfigs.TestDistributed, t.TempDir(), "z", 60, 10), distributed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := loadConfig(t, c.format, c.src)
			if c.wantErr == nil && err != nil {
				t.Fatal(err)
			}
			for _, want := range c.wantErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("error = %v\nwant it to contain %q", err, want)
				}
			}
		})
	}
}

// crlHandler is the first rate_limit handler of a config, as Caddy
// decodes it (unknown fields are errors), with a clock of its own.
func crlHandler(t *testing.T, format, src string) (*Handler, *fakeClock) {
	t.Helper()
	if format == "caddyfile" {
		out, err := adapt(t, src)
		if err != nil {
			t.Fatal(err)
		}
		src = out
	}
	raw := findHandler(t, []byte(src))
	h := new(Handler)
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(h); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
	clock := &fakeClock{t: time.Now()}
	h.now = clock.Now
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	return h, clock
}

// findHandler finds the JSON object of the first rate_limit handler.
func findHandler(t *testing.T, config []byte) json.RawMessage {
	t.Helper()
	var walk func(v any) map[string]any
	walk = func(v any) map[string]any {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "rate_limit" {
				return v
			}
			for _, x := range v {
				if found := walk(x); found != nil {
					return found
				}
			}
		case []any:
			for _, x := range v {
				if found := walk(x); found != nil {
					return found
				}
			}
		}
		return nil
	}
	var v any
	if err := json.Unmarshal(config, &v); err != nil {
		t.Fatal(err)
	}
	h := walk(v)
	if h == nil {
		t.Fatalf("no rate_limit handler in %s", config)
	}
	delete(h, "handler")
	raw, _ := json.Marshal(h)
	return raw
}

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

// crlRequest is a request to path with a method, from a client address.
func crlRequest(method, path, remote string) *http.Request {
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

// TestCaddyRateLimitBehaviour runs the request sequences of
// caddy-ratelimit's TestCaddyfileRateLimits (caddyfile_test.go) and
// TestRateLimits (handler_test.go) on their configurations, with the
// same clock: events 10, window 60s, on GET only.
func TestCaddyRateLimitBehaviour(t *testing.T) {
	for _, c := range []struct{ name, format, src string }{
		{"caddyfile_test.go", "caddyfile", crlTestCaddyfile},
		{"handler_test.go", "json", crlTestRateLimits},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, clock := crlHandler(t, c.format, c.src)
			for range 10 {
				expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 200, "")
			}
			expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 429, "60")
			expectStatus(t, h, crlRequest("POST", "/", "10.0.0.1"), 200, "")
			clock.Advance(30 * time.Second) // advanceTime(window / 2)
			expectStatus(t, h, crlRequest("GET", "/", "10.0.0.2"), 429, "30")
			clock.Advance(30 * time.Second) // advanceTime(window)
			expectStatus(t, h, crlRequest("GET", "/", "10.0.0.3"), 200, "")
		})
	}
}

// TestCaddyRateLimitDistinctZonesAndKeys: caddy-ratelimit's
// TestDistinctZonesAndKeys (handler_test.go): zones by method, keys by
// path, each counted on its own.
func TestCaddyRateLimitDistinctZonesAndKeys(t *testing.T) {
	h, _ := crlHandler(t, "json", crlTestDistinctZones)
	for _, method := range []string{"GET", "DELETE"} {
		for _, path := range []string{"/path1", "/path2"} {
			for range 10 {
				expectStatus(t, h, crlRequest(method, path, "10.0.0.1"), 200, "")
			}
			expectStatus(t, h, crlRequest(method, path, "10.0.0.1"), 429, "60")
		}
	}
}

// TestCaddyRateLimitReadmeExamples: what caddy-ratelimit's README says of
// its examples. static_example: 100 GETs a minute across all clients;
// dynamic_example: 2 requests per client address in any 5 seconds;
// per_network: IPv6 clients of one /64 share a bucket.
func TestCaddyRateLimitReadmeExamples(t *testing.T) {
	for _, c := range []struct{ name, format, src string }{
		{"Caddyfile", "caddyfile", crlReadmeCaddyfileLocal},
		{"JSON", "json", crlReadmeJSONLocal},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, clock := crlHandler(t, c.format, c.src)
			expectStatus(t, h, crlRequest("POST", "/", "10.0.0.1"), 200, "")
			expectStatus(t, h, crlRequest("POST", "/", "10.0.0.1"), 200, "")
			expectStatus(t, h, crlRequest("POST", "/", "10.0.0.1"), 429, "5")
			for i := range 100 { // 50 clients, 2 GETs each: the static zone's 100
				expectStatus(t, h, crlRequest("GET", "/", "10.0.1."+strconv.Itoa(i/2)), 200, "")
			}
			expectStatus(t, h, crlRequest("GET", "/", "10.0.2.1"), 429, "60")
			clock.Advance(5 * time.Second)
			expectStatus(t, h, crlRequest("POST", "/", "10.0.0.1"), 200, "")
		})
	}
	for _, c := range []struct{ name, format, src string }{
		{"prefix Caddyfile", "caddyfile", crlSite(crlconfigs.ReadmePrefixCaddyfile)},
		{"prefix JSON", "json", crlHandlerConfig(crlconfigs.ReadmePrefixJSON)},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, _ := crlHandler(t, c.format, c.src)
			for i := range 100 {
				expectStatus(t, h, crlRequest("GET", "/", fmt.Sprintf("[2001:db8:1:2::%x]", i+1)), 200, "")
			}
			expectStatus(t, h, crlRequest("GET", "/", "[2001:db8:1:2:ffff::1]"), 429, "60")
			expectStatus(t, h, crlRequest("GET", "/", "[2001:db8:1:3::1]"), 200, "")
		})
	}
}

// TestCaddyRateLimitNetworkPrefix is caddy-ratelimit's
// TestApplyNetworkPrefix (handler_test.go), its rows verbatim, on the
// zone's bucket: there a prefix of 0 means no grouping, as here an
// explicit 0 does. Buckets are named as there, but a whole address
// without its "/32" or "/128".
func TestCaddyRateLimitNetworkPrefix(t *testing.T) {
	tests := []struct {
		name       string
		key        string
		ipv4Prefix int
		ipv6Prefix int
		expected   string
	}{
		// IPv6 with /64 prefix - different addresses in the same /64 produce the same key
		{"ipv6 /64 full addr", "2001:db8:1234:5678:9abc:def0:1234:5678", 0, 64, "2001:db8:1234:5678::/64"},
		{"ipv6 /64 all ones host", "2001:db8:1234:5678:ffff:ffff:ffff:ffff", 0, 64, "2001:db8:1234:5678::/64"},
		{"ipv6 /64 short addr", "2001:db8:1234:5678::1", 0, 64, "2001:db8:1234:5678::/64"},

		// IPv6 with other prefix lengths
		{"ipv6 /48", "2001:db8:1234:5678::1", 0, 48, "2001:db8:1234::/48"},
		{"ipv6 /128", "2001:db8:1234:5678::1", 0, 128, "2001:db8:1234:5678::1/128"},

		// IPv4 with prefix configured
		{"ipv4 /24", "192.168.1.100", 24, 0, "192.168.1.0/24"},
		{"ipv4 /8", "10.0.0.50", 8, 0, "10.0.0.0/8"},
		{"ipv4 /32", "172.16.5.4", 32, 0, "172.16.5.4/32"},

		// Both prefixes configured - each applies to its own address family
		{"ipv6 with both configured", "2001:db8::1", 24, 64, "2001:db8::/64"},
		{"ipv4 with both configured", "192.168.1.100", 24, 64, "192.168.1.0/24"},

		// Only IPv6 prefix configured - IPv4 addresses pass through unchanged
		{"ipv4 unchanged when only ipv6 configured", "192.168.1.100", 0, 64, "192.168.1.100"},

		// Only IPv4 prefix configured - IPv6 addresses pass through unchanged
		{"ipv6 unchanged when only ipv4 configured", "2001:db8::1", 24, 0, "2001:db8::1"},

		// No prefixes configured - everything passes through unchanged
		{"ipv6 no prefix", "2001:db8::1", 0, 0, "2001:db8::1"},
		{"ipv4 no prefix", "192.168.1.100", 0, 0, "192.168.1.100"},

		// Non-IP keys always pass through unchanged
		{"static key", "static", 0, 64, "static"},
		{"placeholder key", "{http.request.uri}", 0, 64, "{http.request.uri}"},
		{"empty key", "", 0, 64, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := &Zone{IPv4Prefix: configPrefix(tt.ipv4Prefix), IPv6Prefix: configPrefix(tt.ipv6Prefix)}
			want := strings.TrimSuffix(strings.TrimSuffix(tt.expected, "/128"), "/32")
			if got := z.bucket(tt.key).Key; got != want {
				t.Errorf("bucket of %q with prefixes %d, %d: %q; want %q", tt.key, tt.ipv4Prefix, tt.ipv6Prefix, got, want)
			}
		})
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

func TestPrefixLengthJSON(t *testing.T) {
	for _, c := range []struct {
		in   string
		want PrefixLength
		bits int // IPv6 bits in force
		out  string
	}{
		{`{}`, 0, 64, `{}`},
		{`{"ipv6_prefix": 0}`, noGrouping, 128, `{"ipv6_prefix":0}`},
		{`{"ipv6_prefix": 48}`, 48, 48, `{"ipv6_prefix":48}`},
	} {
		var z struct {
			IPv6Prefix PrefixLength `json:"ipv6_prefix,omitempty"`
		}
		if err := json.Unmarshal([]byte(c.in), &z); err != nil || z.IPv6Prefix != c.want {
			t.Fatalf("%s: %v, %v; want %v", c.in, z.IPv6Prefix, err, c.want)
		}
		if b := z.IPv6Prefix.bits(defaultIPv6Prefix, 128); b != c.bits {
			t.Errorf("%s: %d bits; want %d", c.in, b, c.bits)
		}
		if out, _ := json.Marshal(z); string(out) != c.out {
			t.Errorf("%s: marshalled as %s; want %s (a Caddyfile's 0 must survive caddy adapt)", c.in, out, c.out)
		}
	}
	var z Zone
	if err := json.Unmarshal([]byte(`{"ipv4_prefix": -1}`), &z); err == nil {
		t.Fatal("a negative prefix was accepted")
	}
}

func TestZoneCompatChecks(t *testing.T) {
	cases := map[string]struct {
		zone *Zone
		want string // "" when valid
	}{
		"events and window":       {&Zone{MaxEvents: 10, Window: caddy.Duration(time.Minute)}, ""},
		"1m30s":                   {&Zone{MaxEvents: 3, Window: caddy.Duration(90 * time.Second)}, ""},
		"500ms":                   {&Zone{MaxEvents: 1, Window: caddy.Duration(500 * time.Millisecond)}, ""},
		"no key: one bucket":      {&Zone{Rate: "1r/s"}, ""},
		"rate and events":         {&Zone{Rate: "1r/s", MaxEvents: 10, Window: caddy.Duration(time.Minute)}, "rate and events/window both set the limit"},
		"rate and window":         {&Zone{Rate: "1r/s", Window: caddy.Duration(time.Minute)}, "rate and events/window both set the limit"},
		"events without window":   {&Zone{MaxEvents: 10}, "events 10 needs a window"},
		"window without events":   {&Zone{Window: caddy.Duration(time.Minute)}, "window needs events"},
		"negative events":         {&Zone{MaxEvents: -1, Window: caddy.Duration(time.Minute)}, "window needs events"},
		"window under 1ms":        {&Zone{MaxEvents: 1, Window: caddy.Duration(time.Microsecond)}, "window 1µs: want 1ms to 100 years"},
		"over the log's cap":      {&Zone{MaxEvents: maxLogLimit + 1, Window: caddy.Duration(time.Minute)}, "add algorithm sliding_window_counter"},
		"over the cap, counter":   {&Zone{MaxEvents: maxLogLimit + 1, Window: caddy.Duration(time.Minute), Algorithm: "sliding_window_counter"}, ""},
		"over the cap, named log": {&Zone{MaxEvents: maxLogLimit + 1, Window: caddy.Duration(time.Minute), Algorithm: "sliding_window_log"}, "use sliding_window_counter"},
		"events with burst":       {&Zone{MaxEvents: 5, Window: caddy.Duration(time.Minute), Burst: "3"}, "burst does not apply to sliding_window_log"},
		"events and concurrency":  {&Zone{MaxEvents: 5, Window: caddy.Duration(time.Minute), MaxConcurrent: 2}, "rate, events, window"},
		"skip without key":        {&Zone{Rate: "1r/s", OnEmptyKey: "skip"}, "on_empty_key skip needs a key"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			z := c.zone
			z.name = "z"
			err := z.check()
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("check() = %v; want %q", err, c.want)
			}
		})
	}
	z := &Zone{name: "z", MaxEvents: 3, Window: caddy.Duration(90 * time.Second)}
	if err := z.check(); err != nil || z.policy.Algorithm.String() != "sliding_window_log" || z.policy.Rate != 3 || z.policy.Period != 90*time.Second {
		t.Fatalf("events 3 window 1m30s: %v, policy %+v; want a sliding log of 3 per 90s", err, z.policy)
	}
}

// TestStaticBucketWithoutKey: a zone without a key limits everybody
// together.
func TestStaticBucketWithoutKey(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"all": {MaxEvents: 2, Window: caddy.Duration(time.Minute)}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 200, "")
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.2"), 200, "")
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.3"), 429, "60")
}

// TestSubSecondWindow: events 2 in any 500ms; Retry-After says 1, the
// least it can.
func TestSubSecondWindow(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"fast": {Key: "k", MaxEvents: 2, Window: caddy.Duration(500 * time.Millisecond)}}}
	clock := &fakeClock{t: time.Now()}
	h.now = clock.Now
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 200, "")
	clock.Advance(300 * time.Millisecond)
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 200, "")
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 429, "1")
	clock.Advance(200 * time.Millisecond) // the first leaves the window
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 200, "")
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 429, "1")
}

func TestHandlerCompatOptions(t *testing.T) {
	zone := func() *Zone { return &Zone{Key: "k", Rate: "1r/s"} }
	cases := map[string]struct {
		h    *Handler
		want string
	}{
		"rate_limits join zones": {&Handler{RateLimits: map[string]*Zone{"a": zone()}, Zones: map[string]*Zone{"b": zone()}}, ""},
		"a name in both":         {&Handler{RateLimits: map[string]*Zone{"a": zone()}, Zones: map[string]*Zone{"a": zone()}}, `zone "a" is both in zones and in rate_limits`},
		"negative jitter":        {&Handler{Jitter: -0.1, Zones: map[string]*Zone{"a": zone()}}, "jitter -0.1: want a fraction of the wait from 0 to 1"},
		"jitter over 1":          {&Handler{Jitter: 20, Zones: map[string]*Zone{"a": zone()}}, "jitter 20"},
		"jitter NaN":             {&Handler{Jitter: math.NaN(), Zones: map[string]*Zone{"a": zone()}}, "jitter NaN"},
		"negative sweep":         {&Handler{SweepInterval: -1, Zones: map[string]*Zone{"a": zone()}}, "sweep_interval"},
		"sweep_interval":         {&Handler{SweepInterval: caddy.Duration(time.Minute), Zones: map[string]*Zone{"a": zone()}}, ""},
		"distributed null":       {&Handler{Distributed: json.RawMessage("null"), Zones: map[string]*Zone{"a": zone()}}, ""},
		"storage":                {&Handler{Storage: json.RawMessage(`{"module":"file_system","root":"/x"}`), Zones: map[string]*Zone{"a": zone()}}, "storage: caddy-ratelimit's distributed"},
		"negative log interval":  {&Handler{LogRefusals: &RefusalLog{Interval: -1}, Zones: map[string]*Zone{"a": zone()}}, "log_refusals: interval"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			err := provision(t, c.h)
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("Provision = %v; want %q", err, c.want)
			}
		})
	}
	h := &Handler{LogKey: true, RateLimits: map[string]*Zone{"a": zone()}}
	if err := provision(t, h); err != nil || !h.LogKeys || len(h.zones) != 1 || h.zones[0].name != "a" {
		t.Fatalf("log_key and rate_limits: %v, log_keys %v, zones %v", err, h.LogKeys, h.zones)
	}
}

// TestDistributedShowsRedis: the error shows the redis block equivalent
// to a Redis storage (caddy-storage-redis's fields), in the Caddyfile and
// in JSON, and never the storage's password.
func TestDistributedShowsRedis(t *testing.T) {
	storage := json.RawMessage(`{"module": "redis", "host": ["10.0.0.5", "10.0.0.6"], "port": ["6380"],
		"password": "hunter2", "db": 2, "username": "rl", "tls_enabled": true, "client_type": "cluster"}`)
	err := refuseDistributed(json.RawMessage(`{"read_interval": "5s"}`), storage)
	for _, want := range []string{
		"distributed: caddy-ratelimit's distributed",
		"\tredis {\n\t\taddresses 10.0.0.5:6380 10.0.0.6:6380\n\t\tcluster\n\t\tusername rl\n\t\tpassword {env.REDIS_PASSWORD}\n\t\tdb 2\n\t\ttls\n\t}",
		`in JSON: "redis": {"addresses":["10.0.0.5:6380","10.0.0.6:6380"],"cluster":true,"username":"rl","password":"{env.REDIS_PASSWORD}","db":2,"tls":{}}`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error = %v\nwant it to contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("the storage's password is in the error: %v", err)
	}
}

// TestCaddyfileCompat: caddy-ratelimit's options in the Caddyfile and
// the JSON they adapt to.
func TestCaddyfileCompat(t *testing.T) {
	out, err := adapt(t, `:8080 {
	rate_limit {
		log_key
		jitter 0.2
		disable_metrics
		sweep_interval 2m
		log_refusals 30s
		zone login {
			events      5
			window      1m30s
			ipv4_prefix 0
			ipv6_prefix 0
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"disable_metrics":true,"handler":"rate_limit","jitter":0.2,"log_keys":true,"log_refusals":{"interval":30000000000},"sweep_interval":120000000000`,
		`"zones":{"login":{"ipv4_prefix":0,"ipv6_prefix":0,"max_events":5,"window":90000000000}}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("adapted config lacks\n%s\nin\n%s", want, out)
		}
	}
	h, _ := crlHandler(t, "caddyfile", `:8080 {
	rate_limit {
		zone a {
			key {client_ip}
			events 1
			window 1m
			ipv6_prefix 0
		}
	}
}`)
	if a, b := h.zones[0].bucket("2001:db8::1").Key, h.zones[0].bucket("2001:db8::2").Key; a == b {
		t.Fatalf("ipv6_prefix 0 groups addresses: %q and %q share a bucket", a, b)
	}
}

func TestCaddyfileCompatErrors(t *testing.T) {
	zone := func(body string) string {
		return ":8080 {\n\trate_limit {\n\t\tzone api {\n" + body + "\n\t\t}\n\t}\n}\n"
	}
	top := func(line string) string {
		return ":8080 {\n\trate_limit {\n\t\t" + line + "\n\t\tzone z {\n\t\t\trate 1r/s\n\t\t}\n\t}\n}\n"
	}
	cases := []struct{ name, src, want string }{
		{"rate and events", zone("\t\t\trate 1r/s\n\t\t\tevents 5\n\t\t\twindow 1m"), `zone "api": rate and events/window both set the limit: use one of them, at Caddyfile:3`},
		{"events without window", zone("\t\t\tevents 5"), `zone "api": events 5 needs a window: events <N> with window <duration>, at Caddyfile:3`},
		{"window without events", zone("\t\t\twindow 1m"), `zone "api": window needs events (JSON max_events): a number of at least 1, at Caddyfile:3`},
		{"events zero", zone("\t\t\tevents 0\n\t\t\twindow 1m"), `events "0": want a whole number of at least 1, at Caddyfile:4`},
		{"window bad", zone("\t\t\tevents 1\n\t\t\twindow soon"), `zone "api": window "soon": want a duration of at least 1ms, such as 1m, at Caddyfile:5`},
		{"events over the cap", zone("\t\t\tevents 20000\n\t\t\twindow 1h"), `zone "api": events 20000: the sliding log keeps one entry per event, at most 10000 per key; for more, add algorithm sliding_window_counter`},
		{"prefix negative", zone("\t\t\trate 1r/s\n\t\t\tipv6_prefix -1"), `zone "api": ipv6_prefix "-1": want 0 (no grouping) to 128, at Caddyfile:5`},
		{"jitter over 1", top("jitter 20"), `jitter "20": want a fraction of the wait from 0 to 1 (0.2 adds up to 20%), at Caddyfile:3`},
		{"jitter word", top("jitter some"), `jitter "some"`},
		{"sweep_interval", top("sweep_interval never"), `sweep_interval "never": want a positive duration such as 1m, at Caddyfile:3`},
		{"log_refusals", top("log_refusals often"), `log_refusals "often": want an interval such as 1m, at Caddyfile:3`},
		{"distributed", top("distributed {\n\t\t\tread_interval 5s\n\t\t}"), "distributed: caddy-ratelimit's distributed rate limiting (instances trading approximate counts through storage) is not supported, and each instance limiting alone in its place would be a silent downgrade. Share one exact limit through Redis: replace distributed and storage with\n\tredis {\n\t\taddresses <host:port>\n\t}, at Caddyfile:3"},
		{"storage redis", top("storage redis cluster {\n\t\t\taddress {\n\t\t\t\t10.0.0.1:6379\n\t\t\t\t10.0.0.2:6379\n\t\t\t}\n\t\t\tpassword secret\n\t\t}"),
			"storage: caddy-ratelimit's distributed rate limiting (instances trading approximate counts through storage) is not supported, and each instance limiting alone in its place would be a silent downgrade. Share one exact limit through Redis: replace distributed and storage with\n\tredis {\n\t\taddresses 10.0.0.1:6379 10.0.0.2:6379\n\t\tcluster\n\t\tpassword {env.REDIS_PASSWORD}\n\t}, at Caddyfile:3"},
		{"storage file_system", top("storage file_system /var/lib/caddy"), "replace distributed and storage with\n\tredis {\n\t\taddresses <host:port>\n\t}, at Caddyfile:3"},
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

// TestJitterProportional: jitter 0.5 adds 0 to half the wait, at random.
func TestJitterProportional(t *testing.T) {
	h := &Handler{Jitter: 0.5, Zones: map[string]*Zone{"j": {Key: "k", MaxEvents: 1, Window: caddy.Duration(time.Minute)}}}
	clock := &fakeClock{t: time.Now()}
	h.now = clock.Now
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 200, "")
	seen := map[int]bool{}
	for range 200 {
		w := serve(h, crlRequest("GET", "/", "10.0.0.1"))
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

// TestExceededNamePlaceholder: {http.rate_limit.exceeded.name} names the
// refusing zone, as in caddy-ratelimit, and is not set when allowed.
func TestExceededNamePlaceholder(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"tight": {Key: "k", MaxEvents: 1, Window: caddy.Duration(time.Minute)}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"", "tight"} {
		r := crlRequest("GET", "/", "10.0.0.1")
		repl := caddyhttp.NewTestReplacer(r)
		_ = h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		if got, _ := repl.GetString("http.rate_limit.exceeded.name"); got != want {
			t.Fatalf("request %d: {http.rate_limit.exceeded.name} = %q; want %q", i, got, want)
		}
	}
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

func TestExceededEvent(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"login": {Key: "{http.request.remote.host}", MaxEvents: 1, Window: caddy.Duration(time.Minute)}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	rec := new(eventRecorder)
	withEvents(t, h, rec)
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 200, "")
	expectStatus(t, h, crlRequest("GET", "/", "10.0.0.1"), 429, "60")
	if len(rec.events) != 1 {
		t.Fatalf("%d events; want 1, for the refusal only", len(rec.events))
	}
	ev := rec.events[0]
	wait, _ := ev.Data["wait"].(time.Duration)
	if ev.Name() != "rate_limit_exceeded" || ev.Data["zone"] != "login" || ev.Data["remote_ip"] != "10.0.0.1" ||
		ev.Data["client_ip"] != "10.0.0.1" || ev.Data["retry_after"] != int64(60) || wait <= 59*time.Second || wait > time.Minute {
		t.Fatalf("event %s %v", ev.Name(), ev.Data)
	}
}

// refusalLogHandler is a handler with log_refusals whose info logs a
// test reads; zones a and b (on /b) allow one request a minute per
// client address, keyed by an API key.
func refusalLogHandler(t *testing.T, logKeys bool) (*Handler, *observer.ObservedLogs, *fakeClock) {
	t.Helper()
	zone := func() *Zone {
		return &Zone{Key: "{http.request.header.X-API-Key}", MaxEvents: 1, Window: caddy.Duration(time.Minute)}
	}
	h := &Handler{LogRefusals: &RefusalLog{}, LogKeys: logKeys, Zones: map[string]*Zone{"a": zone(), "b": zone()}}
	h.Zones["a"].MatcherSetsRaw = caddyhttp.RawMatcherSets{{"path": json.RawMessage(`["/a"]`)}}
	h.Zones["b"].MatcherSetsRaw = caddyhttp.RawMatcherSets{{"path": json.RawMessage(`["/b"]`)}}
	clock := &fakeClock{t: time.Now()}
	h.now = clock.Now
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	h.logger = zap.New(core)
	return h, logs, clock
}

func TestRefusalLog(t *testing.T) {
	h, logs, clock := refusalLogHandler(t, false)
	send := func(path, client string) {
		r := crlRequest("GET", path, client)
		r.Header.Set("X-API-Key", "secret-key-"+client)
		serve(h, r)
	}
	for range 5 {
		send("/a", "10.0.0.1") // 1 allowed, 4 refused: one line
	}
	send("/b", "10.0.0.1")
	send("/b", "10.0.0.1") // another zone: a line
	send("/a", "10.0.0.2")
	send("/a", "10.0.0.2") // another client: a line
	clock.Advance(59 * time.Second)
	send("/a", "10.0.0.1") // within the interval: none
	if n := logs.Len(); n != 3 {
		t.Fatalf("%d lines; want 3: %v", n, logs.All())
	}
	clock.Advance(time.Second)
	send("/a", "10.0.0.1") // allowed again (the window passed)
	send("/a", "10.0.0.1") // refused, the interval passed: a line
	lines := logs.All()
	if len(lines) != 4 {
		t.Fatalf("%d lines; want 4", len(lines))
	}
	want := map[string]any{"zone": "a", "client_ip": "10.0.0.1", "remote_ip": "10.0.0.1", "host": "example.com",
		"method": "GET", "path": "/a", "retry_after": int64(60), "wait": time.Minute}
	got := lines[0].ContextMap()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("field %s = %v; want %v", k, got[k], v)
		}
	}
	for _, l := range lines {
		if l.Level != zap.InfoLevel || l.Message != "rate limit exceeded" {
			t.Errorf("line %v %q; want info \"rate limit exceeded\"", l.Level, l.Message)
		}
		if _, ok := l.ContextMap()["key"]; ok || strings.Contains(fmt.Sprint(l.ContextMap()), "secret-key") {
			t.Errorf("a key is logged without log_keys: %v", l.ContextMap())
		}
	}
	h, logs, _ = refusalLogHandler(t, true)
	for range 2 {
		r := crlRequest("GET", "/a", "10.0.0.9")
		r.Header.Set("X-API-Key", "k-9")
		serve(h, r)
	}
	if lines := logs.All(); len(lines) != 1 || lines[0].ContextMap()["key"] != "k-9" {
		t.Fatalf("with log_keys: %v; want one line with key k-9", lines)
	}
}

// TestRefusalThrottleBounded: a flood of distinct clients is remembered
// in at most two generations of the limit, and each of them logged once.
func TestRefusalThrottleBounded(t *testing.T) {
	th := newRefusalThrottle(time.Hour, 100)
	now := time.Now().UnixNano()
	for i := range 1000 {
		if !th.allow("z", "10.0."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256), now) {
			t.Fatalf("client %d not logged", i)
		}
		th.mu.Lock()
		n := len(th.cur) + len(th.prev)
		th.mu.Unlock()
		if n > 200 {
			t.Fatalf("%d digests remembered; want at most 200", n)
		}
	}
	if th.allow("z", "10.0.3.231", now) { // the last one: remembered
		t.Fatal("a client was logged twice within the interval")
	}
	if !th.allow("z", "10.0.3.231", now+int64(time.Hour)) {
		t.Fatal("a client was not logged again after the interval")
	}
}

// TestDisableMetrics: a handler with disable_metrics counts no decisions.
func TestDisableMetrics(t *testing.T) {
	h := &Handler{DisableMetrics: true, Zones: map[string]*Zone{"quiet_zone": {Key: "k", Rate: "1r/m"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	before := metricCount(t, "quiet_zone")
	serve(h, crlRequest("GET", "/", "10.0.0.1"))
	serve(h, crlRequest("GET", "/", "10.0.0.1"))
	if after := metricCount(t, "quiet_zone"); after != before {
		t.Fatalf("decisions of quiet_zone went from %v to %v", before, after)
	}
	h2 := &Handler{Zones: map[string]*Zone{"loud_zone": {Key: "k", Rate: "1r/m"}}}
	if err := provision(t, h2); err != nil {
		t.Fatal(err)
	}
	serve(h2, crlRequest("GET", "/", "10.0.0.1"))
	if metricCount(t, "loud_zone") == 0 {
		t.Fatal("a handler without disable_metrics counted nothing")
	}
}

// metricCount sums caddy_rate_limit_decisions_total of a zone.
func metricCount(t *testing.T, zone string) float64 {
	t.Helper()
	var sum float64
	for _, result := range []string{resultAllowed, resultDenied} {
		c, err := metrics.decisions.GetMetricWithLabelValues(zone, result)
		if err != nil {
			t.Fatal(err)
		}
		sum += testutil.ToFloat64(c)
	}
	return sum
}

// BenchmarkServeHTTPRefused: the refusal path, the handler alone (see
// benchServer), its logger at info level (Caddy's default): as it is by
// default (no events app), with an event subscriber (whose events app
// logs each event with the debug logger Caddy gives tests), and with
// log_refusals (throttled: no line written).
func BenchmarkServeHTTPRefused(b *testing.B) {
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
