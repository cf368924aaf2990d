package ratelimit

import (
	"cmp"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
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

func TestJWTConfigErrors(t *testing.T) {
	t.Setenv("RL_TEST_SHORT", "short")
	cases := map[string]struct {
		cfg  JWTConfig
		want string
	}{
		"no key":              {JWTConfig{}, "no key"},
		"unknown placeholder": {JWTConfig{Secret: "{ENV.JWT_SECRET}"}, "secret: unrecognized placeholder"},
		"unset env":           {JWTConfig{Secret: "{env.RL_TEST_UNSET}"}, "evaluated placeholder {env.RL_TEST_UNSET} is empty"},
		"short secret":        {JWTConfig{Secret: "{env.RL_TEST_SHORT}"}, "secret of 5 bytes: want at least 32"},
		"header and cookie":   {JWTConfig{Secret: strings.Repeat("s", 32), FromHeader: "X", FromCookie: "c"}, "not both"},
		"missing pem":         {JWTConfig{PublicKeyFile: "/nonexistent.pem"}, "no such file"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if _, _, err := c.cfg.verifier(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("verifier() = %v; want %q", err, c.want)
			}
		})
	}
}

// FuzzServeHTTP: whatever the headers (token, API key, client address,
// burst and cost), a request is answered 200 or 429, never a crash.
func FuzzServeHTTP(f *testing.F) {
	secret := strings.Repeat("s", 32)
	h := &Handler{
		JWT: &JWTConfig{Secret: secret},
		Zones: map[string]*Zone{
			"ip": {Key: "{http.request.header.X-Client}", Rate: "1000r/s", IPv4Prefix: 24, IPv6Prefix: 64},
			"user": {Key: "{http.rate_limit.jwt.sub}:{http.request.header.X-API-Key}", Rate: "{http.rate_limit.jwt.rate}",
				DefaultRate: "100r/s", Burst: "{http.request.header.X-Burst}", Cost: "{http.request.header.X-Cost}"},
			"org": {Key: "{http.rate_limit.jwt.org.id}", Rate: "1r/s", OnEmptyKey: "skip"},
		},
	}
	if err := provision(f, h); err != nil {
		f.Fatal(err)
	}
	valid, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "alice", "rate": "5r/s", "org": map[string]any{"id": "o1"}, "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString([]byte(secret))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("Bearer "+valid, "key-1", "10.0.0.1", "5", "1")
	f.Add("Bearer x.y.z", "", "2001:db8::1", "{", "999999999999999999999")
	f.Add("", "{a}", "::ffff:1.2.3.4", "-1", "0")
	f.Add("bearer  ", "\x00", "not an ip", "1e9", " 2")
	f.Fuzz(func(t *testing.T, auth, apiKey, client, burst, cost string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["Authorization"] = []string{auth}
		r.Header["X-Api-Key"] = []string{apiKey}
		r.Header["X-Client"] = []string{client}
		r.Header["X-Burst"] = []string{burst}
		r.Header["X-Cost"] = []string{cost}
		if w := serve(h, r); w.Code != http.StatusOK && w.Code != http.StatusTooManyRequests {
			t.Fatalf("status %d", w.Code)
		}
	})
}

func TestJWTTokenSources(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer  abc.def.ghi ")
	r.Header.Set("X-Token", "bearer tok.en.x")
	r.AddCookie(&http.Cookie{Name: "session", Value: "coo.kie.y"})
	cases := []struct {
		cfg  JWTConfig
		want string
	}{
		{JWTConfig{}, "abc.def.ghi"},
		{JWTConfig{FromHeader: "X-Token"}, "tok.en.x"},
		{JWTConfig{FromHeader: "X-Missing"}, ""},
		{JWTConfig{FromCookie: "session"}, "coo.kie.y"},
		{JWTConfig{FromCookie: "missing"}, ""},
	}
	for _, c := range cases {
		if got := c.cfg.token(r); got != c.want {
			t.Errorf("%+v: token %q; want %q", c.cfg, got, c.want)
		}
	}
	basic := httptest.NewRequest(http.MethodGet, "/", nil)
	basic.SetBasicAuth("u", "p")
	if got := (&JWTConfig{}).token(basic); !strings.HasPrefix(got, "Basic ") {
		t.Errorf("Basic credentials: token %q; want them left as they are (and refused by the verifier)", got)
	}
}
