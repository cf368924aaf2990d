package ratelimit

import (
	"cmp"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
