package ratelimit

import (
	"crypto/rand"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-ratelimit/caddy-rate-limit/clientkey"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/jwkstest"
)

// jwksHandler provisions a handler that trusts cfg's keys, with a zone
// per user, on clock (time.Now when nil). It is cleaned up when the test
// ends.
func jwksHandler(t *testing.T, cfg JWTConfig, clock *jwkstest.Clock) *Handler {
	t.Helper()
	h := &Handler{JWT: &cfg, Zones: map[string]*Zone{
		"user": {Key: "{http.rate_limit.jwt.sub}", Rate: "100r/s", OnEmptyKey: "skip"},
	}}
	if clock != nil {
		h.now = clock.Now
	}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	return h
}

// subject is the sub claim h reads from token, "" when it accepts none.
func subject(h *Handler, token string) string {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	sub, _ := h.verify(r)["sub"].(string)
	return sub
}

// ms is n milliseconds as a config duration.
func ms(n int) caddy.Duration { return caddy.Duration(time.Duration(n) * time.Millisecond) }

func TestJWKSURLRotationWithoutReload(t *testing.T) {
	p := jwkstest.New(t, false)
	h := jwksHandler(t, JWTConfig{JWKSURL: p.URL + jwkstest.JWKSPath, Issuer: p.URL, RefreshMin: ms(100), RefreshMax: ms(200)}, nil)
	if got := subject(h, p.Sign(t, "key-1", jwt.MapClaims{"sub": "alice"})); got != "alice" {
		t.Fatalf("sub %q from a token of the fetched key; want alice", got)
	}
	p.AddKey(t, "key-2")
	p.RemoveKey("key-1")
	rotated := p.Sign(t, "key-2", jwt.MapClaims{"sub": "bob"})
	jwkstest.Eventually(t, "the rotated key accepted", func() bool { return subject(h, rotated) == "bob" })
	if got := subject(h, p.Sign(t, "key-1", jwt.MapClaims{"sub": "alice"})); got != "" {
		t.Errorf("sub %q from the key no longer published", got)
	}
	w := serve(h, authorized(rotated))
	if w.Code != http.StatusOK || w.Header().Get("X-RateLimit-Limit") == "" {
		t.Errorf("request with the rotated key: %d, headers %v; want 200 limited in the user zone", w.Code, w.Header())
	}
}

func authorized(token string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}

func TestJWKSRandomKIDsThroughHandler(t *testing.T) {
	p := jwkstest.New(t, false)
	clock := jwkstest.NewClock(time.Now())
	h := jwksHandler(t, JWTConfig{JWKSURL: p.URL + jwkstest.JWKSPath, RefreshMin: ms(250), RefreshMax: caddy.Duration(time.Hour)}, clock)
	tokens := make([]string, 1000)
	for i := range tokens {
		tokens[i] = p.Sign(t, rand.Text(), jwt.MapClaims{"sub": "mallory"})
	}
	for interval := int64(1); interval <= 3; interval++ {
		for _, tok := range tokens {
			if subject(h, tok) != "" {
				t.Fatal("a token of a made-up kid accepted")
			}
		}
		if interval > 1 { // the interval of the last fetch is over: one fetch
			jwkstest.Eventually(t, "the fetch for unknown kids", func() bool { return p.JWKSFetches.Load() >= interval })
		}
		time.Sleep(50 * time.Millisecond) // a second fetch, if one was let through
		if n := p.JWKSFetches.Load(); n != interval {
			t.Fatalf("interval %d: %d fetches for 1,000 unknown kids; want at most one more than the first fetch per interval (%d)", interval, n, interval)
		}
		clock.Add(250 * time.Millisecond)
	}
}

func TestJWKSSharedAcrossReloadsAndStoppedByCleanup(t *testing.T) {
	p := jwkstest.New(t, false)
	cfg := JWTConfig{JWKSURL: p.URL + jwkstest.JWKSPath, RefreshMin: ms(100), RefreshMax: ms(100)}
	old := jwksHandler(t, cfg, nil)
	reloaded := jwksHandler(t, cfg, nil) // the new config, before the old one is cleaned up
	if old.jwksKey != reloaded.jwksKey {
		t.Fatal("two handlers with one JWKS config do not share a fetcher")
	}
	var set *clientkey.RemoteKeySet
	jwksFetchers.Range(func(key, v any) bool {
		if key == reloaded.jwksKey {
			set = v.(*jwksFetcher).set
		}
		return set == nil
	})
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	n := p.JWKSFetches.Load()
	jwkstest.Eventually(t, "refreshes after the old config is gone", func() bool { return p.JWKSFetches.Load() > n })
	if subject(reloaded, p.Sign(t, "key-1", jwt.MapClaims{"sub": "carol"})) != "carol" {
		t.Fatal("the reloaded handler lost the keys")
	}
	if err := reloaded.Cleanup(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-set.Done():
	default:
		t.Fatal("the fetcher's goroutine still runs after the last handler's Cleanup")
	}
	n = p.JWKSFetches.Load()
	time.Sleep(300 * time.Millisecond) // three refresh intervals
	if m := p.JWKSFetches.Load(); m != n {
		t.Errorf("%d fetches after the last Cleanup", m-n)
	}
}

func TestJWKSFirstFetchFailsCaddyStarts(t *testing.T) {
	p := jwkstest.New(t, false)
	p.Fail(http.StatusBadGateway)
	cfg := JWTConfig{JWKSURL: p.URL + jwkstest.JWKSPath, RefreshMin: ms(100), RefreshMax: caddy.Duration(time.Hour)}
	label := jwksLabel(cfg.JWKSURL)
	h := jwksHandler(t, cfg, nil) // provisions despite the failure
	token := p.Sign(t, "key-1", jwt.MapClaims{"sub": "dave"})
	if got := subject(h, token); got != "" {
		t.Fatalf("sub %q before any key arrived", got)
	}
	if n := testutil.ToFloat64(metrics.jwksFetches.WithLabelValues(label, jwksFetchError)); n < 1 {
		t.Errorf("%v failed fetches counted; want at least 1", n)
	}
	if age := jwksAge(t, label); !math.IsInf(age, 1) {
		t.Errorf("age %v without keys; want +Inf", age)
	}
	p.Fail(0)
	jwkstest.Eventually(t, "claims once the provider answers", func() bool { return subject(h, token) == "dave" })
	// At least one: the scheduled retry and a refetch asked for by the
	// token's kid (both every 100ms here) may both succeed.
	if n := testutil.ToFloat64(metrics.jwksFetches.WithLabelValues(label, jwksFetchOK)); n < 1 {
		t.Errorf("%v good fetches counted; want at least 1", n)
	}
}

func TestJWKSFetchTimeoutBoundsProvision(t *testing.T) {
	p := jwkstest.New(t, false)
	p.Delay(5 * time.Second)
	start := time.Now()
	h := jwksHandler(t, JWTConfig{JWKSURL: p.URL + jwkstest.JWKSPath, FetchTimeout: ms(200)}, nil)
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("provisioning took %s with a fetch_timeout of 200ms", took)
	}
	if got := subject(h, p.Sign(t, "key-1", jwt.MapClaims{"sub": "erin"})); got != "" {
		t.Errorf("sub %q with no key fetched", got)
	}
}

func TestJWKSConfigErrorNeitherWaitsNorKeepsAFetcher(t *testing.T) {
	p := jwkstest.New(t, false)
	p.Delay(5 * time.Second)
	cfg := JWTConfig{JWKSURL: p.URL + jwkstest.JWKSPath, FromHeader: "X-Token", FromCookie: "session"}
	h := &Handler{JWT: &cfg, Zones: map[string]*Zone{"z": {Key: "k", Rate: "1r/s"}}}
	start := time.Now()
	if err := provision(t, h); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("Provision: %v; want the from error", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a config error took %s: it waited for the fetch", took)
	}
	jwksFetchers.Range(func(key, _ any) bool {
		if strings.HasPrefix(key.(string), cfg.JWKSURL+"|") {
			t.Error("the fetcher of a refused config is still in the pool")
		}
		return true
	})
}

func TestJWKSDiscoverThroughConfig(t *testing.T) {
	p := jwkstest.New(t, false)
	h := jwksHandler(t, JWTConfig{Issuer: p.URL, Discover: true}, nil)
	if got := subject(h, p.Sign(t, "key-1", jwt.MapClaims{"sub": "frank"})); got != "frank" {
		t.Fatalf("sub %q from a token of the discovered keys; want frank", got)
	}
	if got := subject(h, p.Sign(t, "key-1", jwt.MapClaims{"sub": "frank", "iss": "https://other.example"})); got != "" {
		t.Errorf("sub %q from a token of another issuer", got)
	}
	if d := p.DiscoveryFetches.Load(); d != 1 {
		t.Errorf("%d discovery fetches; want 1", d)
	}
}

func TestJWKSMaxStaleThroughHandler(t *testing.T) {
	p := jwkstest.New(t, false)
	clock := jwkstest.NewClock(time.Now())
	cfg := JWTConfig{JWKSURL: p.URL + jwkstest.JWKSPath, RefreshMin: ms(100), RefreshMax: ms(100), MaxStale: caddy.Duration(time.Minute)}
	h := jwksHandler(t, cfg, clock)
	token := p.Sign(t, "key-1", jwt.MapClaims{"sub": "grace"})
	p.Fail(http.StatusServiceUnavailable)
	n := p.JWKSFetches.Load()
	jwkstest.Eventually(t, "a failed refresh", func() bool { return p.JWKSFetches.Load() > n })
	clock.Add(59 * time.Second)
	if got := subject(h, token); got != "grace" {
		t.Fatalf("sub %q while the provider is down, keys 59s old; want grace", got)
	}
	if age := jwksAge(t, jwksLabel(cfg.JWKSURL)); age != 59 {
		t.Errorf("age %vs; want 59", age)
	}
	clock.Add(2 * time.Second)
	if got := subject(h, token); got != "" {
		t.Fatalf("sub %q from keys older than max_stale", got)
	}
}

// jwksAge reads caddy_rate_limit_jwks_age_seconds{jwks=label}.
func jwksAge(t *testing.T, label string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newJWKSAgeCollector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == label {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no age for %s", label)
	return 0
}

func TestJWTConfigRemoteErrors(t *testing.T) {
	for name, c := range map[string]struct {
		cfg  JWTConfig
		want string
	}{
		"plain http":        {JWTConfig{JWKSURL: "http://auth.example.com/jwks"}, "want https://"},
		"both":              {JWTConfig{JWKSURL: "https://a.example/jwks", Issuer: "https://a.example", Discover: true}, "not both"},
		"discover alone":    {JWTConfig{Discover: true}, "discover needs issuer"},
		"refresh alone":     {JWTConfig{Secret: strings.Repeat("s", 32), MaxStale: caddy.Duration(time.Hour)}, "apply to jwks_url and discover only"},
		"negative interval": {JWTConfig{JWKSURL: "https://a.example/jwks", RefreshMin: -1}, "must be positive"},
	} {
		t.Run(name, func(t *testing.T) {
			h := &Handler{JWT: &c.cfg, Zones: map[string]*Zone{"z": {Key: "k", Rate: "1r/s"}}}
			if err := provision(t, h); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Provision: %v; want %q", err, c.want)
			}
			if h.jwksKey != "" {
				t.Error("a fetcher acquired for a config refused")
			}
		})
	}
}
