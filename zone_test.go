package ratelimit

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-ratelimit/caddy-rate-limit/clientkey"
)

func TestZoneLimits(t *testing.T) {
	cases := []struct {
		name        string
		zone        *Zone
		vars        map[string]string
		rate, burst int64
		cost        int64
	}{
		{"static", &Zone{Rate: "10r/s", Burst: "20", Cost: "2"}, nil, 10, 20, 2},
		{"rate from a placeholder, burst its N", &Zone{Rate: "{http.vars.rate}", DefaultRate: "5r/s"}, map[string]string{"rate": "100r/m"}, 100, 100, 1},
		{"bad rate: the default", &Zone{Rate: "{http.vars.rate}", DefaultRate: "5r/s"}, map[string]string{"rate": "lots"}, 5, 5, 1},
		{"bad burst: N of the resolved rate", &Zone{Rate: "{http.vars.rate}", DefaultRate: "5r/s", Burst: "{http.vars.burst}"}, map[string]string{"rate": "1000r/m", "burst": "-1"}, 1000, 1000, 1},
		{"bad burst: its default", &Zone{Rate: "{http.vars.rate}", DefaultRate: "5r/s", Burst: "{http.vars.burst}", DefaultBurst: 7}, map[string]string{"rate": "1000r/m", "burst": "x"}, 1000, 7, 1},
		{"burst from a placeholder", &Zone{Rate: "10r/s", Burst: "{http.vars.burst}"}, map[string]string{"burst": "50"}, 10, 50, 1},
		{"cost from a placeholder", &Zone{Rate: "10r/s", Cost: "{http.vars.cost}"}, map[string]string{"cost": "3"}, 10, 10, 3},
		{"bad cost: its default", &Zone{Rate: "10r/s", Cost: "{http.vars.cost}", DefaultCost: 4}, map[string]string{"cost": "0"}, 10, 10, 4},
		{"bad cost, no default: 1", &Zone{Rate: "10r/s", Cost: "{http.vars.cost}"}, map[string]string{}, 10, 10, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			z := c.zone
			z.name, z.Key = "z", "k"
			if err := z.check(); err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			repl := caddyhttpTestReplacer(r, c.vars)
			p, cost := z.limits(repl, testLogger(t))
			if p.Rate != c.rate || p.Burst != c.burst || cost != c.cost {
				t.Fatalf("rate %d burst %d cost %d; want %d %d %d", p.Rate, p.Burst, cost, c.rate, c.burst, c.cost)
			}
		})
	}
}

func TestZoneCheckErrors(t *testing.T) {
	cases := map[string]struct {
		zone *Zone
		want string
	}{
		"cost over burst":          {&Zone{Rate: "10r/s", Burst: "4", Cost: "5"}, "cost 5 is more than the limit, 4"},
		"default cost over burst":  {&Zone{Rate: "10r/s", Cost: "{http.vars.c}", DefaultCost: 11}, "cost 11 is more than the limit, 10"},
		"template without default": {&Zone{Rate: "{http.vars.r}"}, "default_rate is required"},
		"bad on_empty_key":         {&Zone{Rate: "1r/s", OnEmptyKey: "drop"}, `on_empty_key "drop"`},
		"bad prefix":               {&Zone{Rate: "1r/s", IPv6Prefix: 129}, "ipv6_prefix 129"},
		"zero cost":                {&Zone{Rate: "1r/s", Cost: "0"}, `cost "0"`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			z := c.zone
			z.name, z.Key = cmp.Or(z.name, "z"), "k"
			err := z.check()
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("check() = %v; want %q", err, c.want)
			}
		})
	}
}

// TestSubnetAsClientkey: the zone's shortcuts (keys that cannot be
// addresses, IPv4 addresses kept whole) give what clientkey.Subnet gives,
// for every prefix.
func TestSubnetAsClientkey(t *testing.T) {
	keys := []string{"", "client-1", "abc", "ABCDEF", "1", "12345", "1.2.3.4", "10.0.0.255", "1.2.3.04", "1.2.3", "1.2.3.4.",
		"256.1.1.1", "1.2.3.4%eth0", "abc%x", "%", "::1", "2001:db8::1", "2001:DB8::1%eth0", "::ffff:1.2.3.4", "1.2:3",
		"fe80::1%zone with spaces", "1.2.3.4 ", " 1.2.3.4", "a.b.c.d", "0.0.0.0", "255.255.255.255", "1..2.3"}
	for range 2000 { // and strings of what addresses are made of
		b := make([]byte, rand.IntN(12))
		for i := range b {
			b[i] = "0123456789abcdefABCDEF.:%zx "[rand.IntN(28)]
		}
		keys = append(keys, string(b))
	}
	for _, v4 := range []int{0, 8, 24, 32} {
		for _, v6 := range []int{0, 48, 64, 128} {
			z := &Zone{IPv4Prefix: configPrefix(v4), IPv6Prefix: configPrefix(v6)}
			for _, k := range keys {
				want := clientkey.Subnet(k, z.IPv4Prefix.bits(defaultIPv4Prefix, 32), z.IPv6Prefix.bits(defaultIPv6Prefix, 128))
				if got := z.subnet(k); got != want {
					t.Fatalf("ipv4_prefix %d, ipv6_prefix %d: subnet(%q) = %q; clientkey.Subnet gives %q", v4, v6, k, got, want)
				}
			}
		}
	}
}

// TestResolveKeyAsReplaceAll: a key that is one placeholder, or none,
// resolves as ReplaceAll would resolve it, whatever the value (absent, a
// header given twice, not a string, unknown).
func TestResolveKeyAsReplaceAll(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/p?q=1&q=2", nil)
	r.Header["X-Twice"] = []string{"a", "b"}
	r.Header.Set("X-Key", "client")
	repl := caddyhttpTestReplacer(r, map[string]string{"v": "var"})
	caddyhttp.SetVar(r.Context(), "n", 42)
	repl.Set("static.number", int64(7))
	for _, key := range []string{"{http.request.header.X-Key}", "{http.request.header.x-key}", "{http.request.header.X-Twice}",
		"{http.request.header.Absent}", "{http.request.header.x-twice}", "{http.vars.client_ip}", "{http.request.uri.query.q}", "{http.vars.v}", "{http.vars.n}", "{http.vars.none}",
		"{static.number}", "{unknown}", "{}", "{a}{b}", "{http.vars.v}-x", "\\{http.vars.v}", "{http.vars.v\\}", "plain", "", "a}b"} {
		z := &Zone{Key: key}
		z.compileKey()
		got := z.Key // a key with no placeholder is itself
		if !z.fixedKey {
			got = z.resolveKey(r, repl, zap.NewNop())
		}
		if want := repl.ReplaceAll(key, ""); got != want {
			t.Errorf("key %q resolves to %q; ReplaceAll gives %q", key, got, want)
		}
	}
}

// TestPlaceholderWarningClipped: a placeholder's value that is no valid
// rate, burst, cost or quota is what a client sent (a header), of any
// length, perhaps a secret: the one warning it makes quotes no more than
// its first 16 bytes.
func TestPlaceholderWarningClipped(t *testing.T) {
	long := "sk_live_" + strings.Repeat("x", 4000)
	for name, z := range map[string]*Zone{
		"rate":  {Rate: "{http.vars.v}", DefaultRate: "5r/s"},
		"burst": {Rate: "10r/s", Burst: "{http.vars.v}"},
		"cost":  {Rate: "10r/s", Cost: "{http.vars.v}"},
		"quota": {Quota: "{http.vars.v}", DefaultQuota: 5, QuotaPer: "day"},
	} {
		t.Run(name, func(t *testing.T) {
			z.name, z.Key = "z", "k"
			if err := z.check(); err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.WarnLevel)
			z.limits(caddyhttpTestReplacer(httptest.NewRequest(http.MethodGet, "/", nil), map[string]string{"v": long}), zap.New(core))
			entries := logs.All()
			if len(entries) != 1 {
				t.Fatalf("%d warnings, want 1", len(entries))
			}
			if msg := fmt.Sprint(entries[0].ContextMap()); len(msg) > 300 || strings.Contains(msg, long[:24]) {
				t.Fatalf("the warning quotes %d bytes: %.200s…", len(msg), msg)
			}
		})
	}
}
