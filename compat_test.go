package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/compatconfigs"
)

// The configurations of caddy-ratelimit (internal/compatconfigs: its README's
// examples and its tests' configurations, verbatim), with the arguments
// its tests give their formats.
var (
	compatTestCaddyfile     = fmt.Sprintf(compatconfigs.TestCaddyfile, 60, 10)
	compatTestRateLimits    = fmt.Sprintf(compatconfigs.TestRateLimits, 60, 10)
	compatTestDistinctZones = fmt.Sprintf(compatconfigs.TestDistinctZones, 10, 10)
	compatTestMetrics       = fmt.Sprintf(compatconfigs.TestMetrics, 10, 2)
	// Its README's examples without distributed (each instance alone).
	compatReadmeCaddyfileNoDistributed = strings.Replace(compatconfigs.ReadmeCaddyfile, "\tdistributed\n", "", 1)
	compatReadmeJSONNoDistributed      = strings.Replace(compatconfigs.ReadmeJSON, "\"distributed\": {},\n", "", 1)
)

// compatSite makes a whole Caddyfile of a bare directive (the README's
// snippets).
func compatSite(directive string) string { return ":80\n\n" + directive + "\nrespond ok\n" }

// compatHandlerConfig makes a whole JSON config of a bare handler.
func compatHandlerConfig(handler string) string {
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
	cases := []struct {
		name, format, src string
		wantErr           []string // nil: it loads
	}{
		{"README Caddyfile example", "caddyfile", compatconfigs.ReadmeCaddyfile, nil},
		{"README Caddyfile example without distributed", "caddyfile", compatReadmeCaddyfileNoDistributed, nil},
		{"README JSON example", "json", compatconfigs.ReadmeJSON, nil},
		{"README JSON example without distributed", "json", compatReadmeJSONNoDistributed, nil},
		{"README order option", "caddyfile", compatconfigs.ReadmeOrder + compatSite(compatconfigs.ReadmePrefixCaddyfile), nil},
		{"README prefix Caddyfile", "caddyfile", compatSite(compatconfigs.ReadmePrefixCaddyfile), nil},
		{"README prefix JSON", "json", compatHandlerConfig(compatconfigs.ReadmePrefixJSON), nil},
		{"caddyfile_test.go", "caddyfile", compatTestCaddyfile, nil},
		{"handler_test.go TestRateLimits", "json", compatTestRateLimits, nil},
		{"handler_test.go TestDistinctZonesAndKeys", "json", compatTestDistinctZones, nil},
		{"metrics_test.go TestMetrics", "json", compatTestMetrics, nil},
		{"distributed_test.go TestDistributed", "json", fmt.Sprintf(compatconfigs.TestDistributed, t.TempDir(), "z", 60, 10), nil},
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

// compatHandler is the first rate_limit handler of a config, as Caddy
// decodes it (unknown fields are errors), with a clock of its own.
func compatHandler(t *testing.T, format, src string) (*Handler, *fakeClock) {
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

// TestCaddyRateLimitBehaviour runs the request sequences of
// caddy-ratelimit's TestCaddyfileRateLimits (caddyfile_test.go) and
// TestRateLimits (handler_test.go) on their configurations, with the
// same clock: events 10, window 60s, on GET only.
func TestCaddyRateLimitBehaviour(t *testing.T) {
	for _, c := range []struct{ name, format, src string }{
		{"caddyfile_test.go", "caddyfile", compatTestCaddyfile},
		{"handler_test.go", "json", compatTestRateLimits},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, clock := compatHandler(t, c.format, c.src)
			for range 10 {
				expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 200, "")
			}
			expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 429, "60")
			expectStatus(t, h, clientRequest("POST", "/", "10.0.0.1"), 200, "")
			clock.Advance(30 * time.Second) // advanceTime(window / 2)
			expectStatus(t, h, clientRequest("GET", "/", "10.0.0.2"), 429, "30")
			clock.Advance(30 * time.Second) // advanceTime(window)
			expectStatus(t, h, clientRequest("GET", "/", "10.0.0.3"), 200, "")
		})
	}
}

// TestCaddyRateLimitDistinctZonesAndKeys: caddy-ratelimit's
// TestDistinctZonesAndKeys (handler_test.go): zones by method, keys by
// path, each counted on its own.
func TestCaddyRateLimitDistinctZonesAndKeys(t *testing.T) {
	h, _ := compatHandler(t, "json", compatTestDistinctZones)
	for _, method := range []string{"GET", "DELETE"} {
		for _, path := range []string{"/path1", "/path2"} {
			for range 10 {
				expectStatus(t, h, clientRequest(method, path, "10.0.0.1"), 200, "")
			}
			expectStatus(t, h, clientRequest(method, path, "10.0.0.1"), 429, "60")
		}
	}
}

// TestCaddyRateLimitReadmeExamples: what caddy-ratelimit's README says of
// its examples. static_example: 100 GETs a minute across all clients;
// dynamic_example: 2 requests per client address in any 5 seconds;
// per_network: IPv6 clients of one /64 share a bucket.
func TestCaddyRateLimitReadmeExamples(t *testing.T) {
	for _, c := range []struct{ name, format, src string }{
		{"Caddyfile", "caddyfile", compatReadmeCaddyfileNoDistributed},
		{"JSON", "json", compatReadmeJSONNoDistributed},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, clock := compatHandler(t, c.format, c.src)
			expectStatus(t, h, clientRequest("POST", "/", "10.0.0.1"), 200, "")
			expectStatus(t, h, clientRequest("POST", "/", "10.0.0.1"), 200, "")
			expectStatus(t, h, clientRequest("POST", "/", "10.0.0.1"), 429, "5")
			for i := range 100 { // 50 clients, 2 GETs each: the static zone's 100
				expectStatus(t, h, clientRequest("GET", "/", "10.0.1."+strconv.Itoa(i/2)), 200, "")
			}
			expectStatus(t, h, clientRequest("GET", "/", "10.0.2.1"), 429, "60")
			clock.Advance(5 * time.Second)
			expectStatus(t, h, clientRequest("POST", "/", "10.0.0.1"), 200, "")
		})
	}
	for _, c := range []struct{ name, format, src string }{
		{"prefix Caddyfile", "caddyfile", compatSite(compatconfigs.ReadmePrefixCaddyfile)},
		{"prefix JSON", "json", compatHandlerConfig(compatconfigs.ReadmePrefixJSON)},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, _ := compatHandler(t, c.format, c.src)
			for i := range 100 {
				expectStatus(t, h, clientRequest("GET", "/", fmt.Sprintf("[2001:db8:1:2::%x]", i+1)), 200, "")
			}
			expectStatus(t, h, clientRequest("GET", "/", "[2001:db8:1:2:ffff::1]"), 429, "60")
			expectStatus(t, h, clientRequest("GET", "/", "[2001:db8:1:3::1]"), 200, "")
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
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 200, "")
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.2"), 200, "")
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.3"), 429, "60")
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
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 200, "")
	clock.Advance(300 * time.Millisecond)
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 200, "")
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 429, "1")
	clock.Advance(200 * time.Millisecond) // the first leaves the window
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 200, "")
	expectStatus(t, h, clientRequest("GET", "/", "10.0.0.1"), 429, "1")
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
		"storage alone":          {&Handler{Storage: json.RawMessage(`{"module":"file_system","root":"/x"}`), Zones: map[string]*Zone{"a": zone()}}, ""},
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
	h, _ := compatHandler(t, "caddyfile", `:8080 {
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
		{"rate and events", zone("\t\t\trate 1r/s\n\t\t\tevents 5\n\t\t\twindow 1m"), `zone "api": rate and events/window both set the limit: use one of them, at Caddyfile:5`},
		{"events without window", zone("\t\t\tevents 5"), `zone "api": events 5 needs a window: events <N> with window <duration>, at Caddyfile:4`},
		{"window without events", zone("\t\t\twindow 1m"), `zone "api": window needs events (JSON max_events): a number of at least 1, at Caddyfile:4`},
		{"events zero", zone("\t\t\tevents 0\n\t\t\twindow 1m"), `events "0": want a whole number of at least 1, at Caddyfile:4`},
		{"window bad", zone("\t\t\tevents 1\n\t\t\twindow soon"), `zone "api": window "soon": want a duration of at least 1ms, such as 1m, at Caddyfile:5`},
		{"events over the cap", zone("\t\t\tevents 20000\n\t\t\twindow 1h"), `zone "api": events 20000: the sliding log keeps one entry per event, at most 10000 per key; for more, add algorithm sliding_window_counter`},
		{"prefix negative", zone("\t\t\trate 1r/s\n\t\t\tipv6_prefix -1"), `zone "api": ipv6_prefix "-1": want 0 (no grouping) to 128, at Caddyfile:5`},
		{"jitter over 1", top("jitter 20"), `jitter "20": want a fraction of the wait from 0 to 1 (0.2 adds up to 20%), at Caddyfile:3`},
		{"jitter word", top("jitter some"), `jitter "some"`},
		{"sweep_interval", top("sweep_interval never"), `sweep_interval "never": want a positive duration such as 1m, at Caddyfile:3`},
		{"log_refusals", top("log_refusals often"), `log_refusals "often": want an interval such as 1m, or off, at Caddyfile:3`},
		{"distributed argument", top("distributed now"), "wrong argument count or unexpected line ending after 'now', at Caddyfile:3"},
		{"distributed unknown", top("distributed {\n\t\t\tinterval 5s\n\t\t}"), `distributed: unrecognized subdirective "interval": want read_interval, write_interval, purge_age or key_secret, at Caddyfile:4`},
		{"distributed bad interval", top("distributed {\n\t\t\tread_interval often\n\t\t}"), `distributed: read_interval "often": want a duration such as 5s, at Caddyfile:4`},
		{"storage without module", top("storage"), "wrong argument count or unexpected line ending after 'storage', at Caddyfile:3"},
		{"storage unknown module", top("storage nosuch"), "module not registered: caddy.storage.nosuch"},
		// caddy-storage-redis is not built in: the redis block to write,
		// from its settings, without its password.
		{"storage redis", top("storage redis cluster {\n\t\t\taddress {\n\t\t\t\t10.0.0.1:6379\n\t\t\t\t10.0.0.2:6379\n\t\t\t}\n\t\t\tpassword secret\n\t\t}"),
			"storage redis: caddy-storage-redis is not built into this Caddy. Share the zones through Redis: replace storage with\n\n\tredis {\n\t\taddresses 10.0.0.1:6379 10.0.0.2:6379\n\t\tcluster\n\t\tpassword {env.REDIS_PASSWORD}\n\t}\n\nin the rate_limit block, at Caddyfile:3"},
		{"distributed then storage redis", top("distributed\n\t\tzone y {\n\t\t\trate 1r/s\n\t\t}\n\t\tstorage redis {\n\t\t\thost 10.0.0.5\n\t\t}"),
			"replace storage with\n\n\tredis {\n\t\taddresses 10.0.0.5:6379\n\t}\n\nin the rate_limit block, at Caddyfile:7"},
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
