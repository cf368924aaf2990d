package clientkey

import (
	"bytes"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/jwkstest"
)

// events collects what a RemoteKeySet reports.
type events struct {
	mu  sync.Mutex
	all []Event
}

func (e *events) report(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

// count is how many events of kind were reported.
func (e *events) count(kind EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// last is the last event reported.
func (e *events) last() Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.all) == 0 {
		return Event{Kind: -1}
	}
	return e.all[len(e.all)-1]
}

// remoteFixture is a provider on a local HTTPS server and a key set that
// fetches from it with the test's clock.
type remoteFixture struct {
	p      *jwkstest.Provider
	clock  *jwkstest.Clock
	set    *RemoteKeySet
	v      *Verifier
	events *events
}

// newRemote starts a key set on a fresh provider; o's URL, Transport, Now
// and Report are filled in. It waits for the first fetch.
func newRemote(t *testing.T, o RemoteOptions) *remoteFixture {
	t.Helper()
	f := &remoteFixture{p: jwkstest.New(t, true), clock: jwkstest.NewClock(time.Now()), events: new(events)}
	if o.URL == "" {
		o.URL = f.p.URL + jwkstest.JWKSPath
	}
	o.Transport, o.Now, o.Report = f.p.Server.Client().Transport, f.clock.Now, f.events.report
	set, err := NewRemoteKeySet(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(set.Stop)
	<-set.Ready()
	f.set = set
	if f.v, err = NewVerifier(Keys{Remote: set}, VerifierOptions{Issuer: f.p.URL}); err != nil {
		t.Fatal(err)
	}
	return f
}

// accepts says whether the verifier takes a token of kid's key.
func (f *remoteFixture) accepts(t *testing.T, kid string) bool {
	t.Helper()
	now := f.clock.Now()
	c, err := f.v.Verify(f.p.Sign(t, kid, jwt.MapClaims{"sub": "u-" + kid, "exp": now.Add(time.Hour).Unix()}), now)
	return err == nil && c["sub"] == "u-"+kid
}

func TestRemoteRotatedKeyAfterRefresh(t *testing.T) {
	// The clock stands still, so no token can ask for a fetch: the
	// scheduled refresh alone brings the new key.
	f := newRemote(t, RemoteOptions{RefreshMin: 100 * time.Millisecond, RefreshMax: 200 * time.Millisecond})
	if !f.accepts(t, "key-1") {
		t.Fatal("key-1 refused after the first fetch")
	}
	if f.accepts(t, "key-2") {
		t.Fatal("key-2 accepted before it exists")
	}
	f.p.AddKey(t, "key-2")
	f.p.RemoveKey("key-1")
	jwkstest.Eventually(t, "the rotated key-2 accepted", func() bool { return f.accepts(t, "key-2") })
	if f.accepts(t, "key-1") {
		t.Error("key-1, no longer published, still accepted")
	}
	if ev := f.events.last(); ev.Kind != Fetched || ev.Keys != 1 || len(ev.Skipped) != 1 {
		t.Errorf("last event %+v; want Fetched with 1 key and the encryption key skipped", ev)
	}
}

func TestRemoteUnknownKIDsFetchOncePerInterval(t *testing.T) {
	const interval = 300 * time.Millisecond
	f := newRemote(t, RemoteOptions{RefreshMin: interval, RefreshMax: time.Hour})
	fetches := func() int64 { return f.p.JWKSFetches.Load() }
	randomKIDs := func() {
		for range 1000 {
			if f.accepts(t, rand.Text()) {
				t.Fatal("a token of an unknown kid accepted")
			}
		}
	}
	randomKIDs() // within the interval of the first fetch: none
	letFetcherAct()
	if n := fetches(); n != 1 {
		t.Fatalf("%d fetches after 1,000 unknown kids within the interval; want 1 (the first)", n)
	}
	f.p.AddKey(t, "key-2")
	for round := int64(2); round <= 3; round++ {
		f.clock.Add(interval)
		randomKIDs()
		jwkstest.Eventually(t, "a fetch for the unknown kids", func() bool { return fetches() >= round })
		f.clock.Add(interval / 2) // still within the interval of that fetch
		randomKIDs()
		letFetcherAct()
		if n := fetches(); n != round {
			t.Fatalf("%d fetches after 2,000 unknown kids in interval %d; want %d", n, round, round)
		}
	}
	if !f.accepts(t, "key-2") {
		t.Error("key-2 refused after the fetches its kid caused")
	}
}

// letFetcherAct gives the key set's goroutine time to act on a request to
// fetch, if one was wrongly let through.
func letFetcherAct() { time.Sleep(50 * time.Millisecond) }

func TestRemoteVerifyNeverWaits(t *testing.T) {
	f := newRemote(t, RemoteOptions{RefreshMin: 100 * time.Millisecond, RefreshMax: time.Hour})
	f.p.Delay(2 * time.Second) // every fetch from now on hangs
	f.clock.Add(time.Minute)
	quick := func(kid string, want bool) {
		start := time.Now()
		if f.accepts(t, kid) != want {
			t.Fatalf("%s: accepted %v while a fetch hangs; want %v", kid, !want, want)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: verifying took %s while a fetch hung: it waited on the fetch", kid, took)
		}
	}
	quick("rotated", false) // asks for a fetch, which hangs
	jwkstest.Eventually(t, "the fetch under way", func() bool { return f.p.JWKSFetches.Load() == 2 })
	quick("key-1", true)
	quick("rotated", false)
}

// TestRemoteAlgorithmsFollowKeys: a verifier with fetched keys admits every
// public-key algorithm (the next set may hold any kind of key), yet takes
// a token only with a key of its algorithm's kind, and never HMAC or none.
func TestRemoteAlgorithmsFollowKeys(t *testing.T) {
	f := newRemote(t, RemoteOptions{RefreshMin: time.Hour, RefreshMax: time.Hour}) // ECDSA keys only
	c := claims(map[string]any{"iss": f.p.URL})
	for name, token := range map[string]string{
		"RS256 under an EC key's kid": sign(t, jwt.SigningMethodRS256, testKeys.rsa, c, "key-1"),
		"RS256 without kid":           sign(t, jwt.SigningMethodRS256, testKeys.rsa, c, ""),
		"HS256 with no secret":        sign(t, jwt.SigningMethodHS256, testKeys.secret, c, "key-1"),
		"alg none":                    sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, c, "key-1"),
		"ES256 of another key":        sign(t, jwt.SigningMethodES256, testKeys.other, c, "key-1"),
	} {
		if got, err := f.v.Verify(token, now); err == nil {
			t.Errorf("%s: accepted (%v)", name, got)
		}
	}
	if _, err := f.v.Verify(sign(t, jwt.SigningMethodES256, testKeys.ec, c, ""), now); err == nil {
		t.Error("ES256 of an unpublished key without kid accepted")
	}
}

func TestRemoteKeepsLastKeysWhileDown(t *testing.T) {
	f := newRemote(t, RemoteOptions{RefreshMin: 100 * time.Millisecond, RefreshMax: 100 * time.Millisecond, MaxStale: time.Hour})
	f.p.Fail(http.StatusServiceUnavailable)
	jwkstest.Eventually(t, "two failed fetches", func() bool { return f.events.count(FetchFailed) >= 2 })
	if !f.accepts(t, "key-1") {
		t.Fatal("the last good keys refused while the provider is down")
	}
	if ev := f.events.last(); !ev.HasKeys || ev.Err == nil || !strings.Contains(ev.Err.Error(), "status 503") {
		t.Errorf("failed fetch reported as %+v", ev)
	}
	f.clock.Add(time.Hour + time.Second)
	if f.accepts(t, "key-1") || f.accepts(t, "key-1") {
		t.Fatal("keys older than max_stale accepted")
	}
	if n := f.events.count(KeysExpired); n != 1 {
		t.Errorf("%d KeysExpired events; want 1", n)
	}
	f.p.Fail(0)
	jwkstest.Eventually(t, "keys again once the provider is back", func() bool { return f.accepts(t, "key-1") })
}

func TestRemoteFirstFetchFails(t *testing.T) {
	p := jwkstest.New(t, true)
	p.Fail(http.StatusInternalServerError)
	ev := new(events)
	set, err := NewRemoteKeySet(RemoteOptions{URL: p.URL + jwkstest.JWKSPath, Transport: p.Server.Client().Transport,
		RefreshMin: 100 * time.Millisecond, RefreshMax: time.Hour, Report: ev.report})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Stop()
	<-set.Ready()
	v, _ := NewVerifier(Keys{Remote: set}, VerifierOptions{})
	token := p.Sign(t, "key-1", nil)
	if _, err := v.Verify(token, time.Now()); !errors.Is(err, errNoKeys) {
		t.Fatalf("before any key: %v; want %v", err, errNoKeys)
	}
	if last := ev.last(); last.Kind != FetchFailed || last.HasKeys {
		t.Errorf("first fetch reported as %+v", last)
	}
	p.Fail(0)
	jwkstest.Eventually(t, "keys after the provider recovers", func() bool {
		_, err := v.Verify(token, time.Now())
		return err == nil
	})
}

func TestRemoteRejectsBadSets(t *testing.T) {
	f := newRemote(t, RemoteOptions{RefreshMin: 100 * time.Millisecond, RefreshMax: 100 * time.Millisecond})
	oversized := append(f.p.JWKS(), bytes.Repeat([]byte(" "), DefaultMaxKeySetSize)...)
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"not json", []byte("<html>Service temporarily unavailable</html>"), "not a JWKS"},
		{"keys not an array", []byte(`{"keys":{"kty":"EC"}}`), "not a JWKS"},
		{"no keys member", []byte(`{"kids":[]}`), "no signature verification key"},
		{"empty set", []byte(`{"keys":[]}`), "no signature verification key"},
		{"only unusable keys", []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"},{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}]}`), "no signature verification key"},
		{"oversized", oversized, "over 1048576 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.p.Serve(c.body)
			// The second fetch from now started after Serve.
			before := f.events.count(FetchFailed)
			jwkstest.Eventually(t, "the bad set fetched", func() bool { return f.events.count(FetchFailed) >= before+2 })
			if ev := f.events.last(); !errors.Is(ev.Err, ErrKeySetRejected) || !strings.Contains(ev.Err.Error(), c.want) || !ev.HasKeys {
				t.Errorf("reported %+v; want the set rejected (%s), the old keys kept", ev, c.want)
			}
			if !f.accepts(t, "key-1") {
				t.Error("the old keys refused after a bad set")
			}
		})
	}
}

func TestRemoteDiscovery(t *testing.T) {
	p := jwkstest.New(t, true)
	open := func(o RemoteOptions) (*RemoteKeySet, *events) {
		ev := new(events)
		o.URL, o.Discover, o.Transport, o.Report = p.URL, true, p.Server.Client().Transport, ev.report
		set, err := NewRemoteKeySet(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(set.Stop)
		<-set.Ready()
		return set, ev
	}
	set, _ := open(RemoteOptions{})
	v, _ := NewVerifier(Keys{Remote: set}, VerifierOptions{Issuer: p.URL})
	if _, err := v.Verify(p.Sign(t, "key-1", nil), time.Now()); err != nil {
		t.Fatalf("a token of the discovered keys: %v", err)
	}
	if d, k := p.DiscoveryFetches.Load(), p.JWKSFetches.Load(); d != 1 || k != 1 {
		t.Errorf("%d discovery and %d JWKS fetches; want 1 and 1", d, k)
	}
	for _, c := range []struct{ issuer, jwksURI, want string }{
		{"https://other.example", "", `issuer "https://other.example"`},
		{"", "http://keys.example/jwks.json", "jwks_uri"},
		{"", "/relative/jwks.json", "jwks_uri"},
	} {
		p.Discovery(c.issuer, c.jwksURI)
		_, ev := open(RemoteOptions{RefreshMin: time.Hour, RefreshMax: time.Hour})
		if last := ev.last(); !errors.Is(last.Err, ErrKeySetRejected) || !strings.Contains(last.Err.Error(), c.want) {
			t.Errorf("discovery of issuer %q, jwks_uri %q: %v; want it rejected for %s", c.issuer, c.jwksURI, last.Err, c.want)
		}
	}
}

func TestRemoteRefusesRedirectToPlainHTTP(t *testing.T) {
	srv := httptest.NewTLSServer(http.RedirectHandler("http://keys.example/jwks.json", http.StatusFound))
	defer srv.Close()
	ev := new(events)
	set, err := NewRemoteKeySet(RemoteOptions{URL: srv.URL, Transport: srv.Client().Transport, Report: ev.report})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Stop()
	<-set.Ready()
	if last := ev.last(); last.Err == nil || !strings.Contains(last.Err.Error(), "want https://") {
		t.Errorf("redirect to plain HTTP: %v; want it refused", last.Err)
	}
}

func TestRemoteStop(t *testing.T) {
	f := newRemote(t, RemoteOptions{RefreshMin: 100 * time.Millisecond, RefreshMax: 100 * time.Millisecond})
	jwkstest.Eventually(t, "a scheduled refresh", func() bool { return f.p.JWKSFetches.Load() >= 2 })
	f.set.Stop()
	select {
	case <-f.set.Done():
	default:
		t.Fatal("Stop returned with the goroutine running")
	}
	n := f.p.JWKSFetches.Load()
	time.Sleep(300 * time.Millisecond) // three refresh intervals
	if m := f.p.JWKSFetches.Load(); m != n {
		t.Errorf("%d fetches after Stop", m-n)
	}
}

func TestCheckKeyURL(t *testing.T) {
	for raw, ok := range map[string]bool{
		"https://auth.example.com/.well-known/jwks.json": true,
		"http://127.0.0.1:8080/jwks":                     true,
		"http://localhost/jwks":                          true,
		"http://[::1]:9/jwks":                            true,
		"http://auth.example.com/jwks":                   false,
		"http://127.0.0.1.nip.io/jwks":                   false,
		"ftp://auth.example.com/jwks":                    false,
		"/jwks.json":                                     false,
		"https://":                                       false,
		"":                                               false,
	} {
		if _, err := CheckKeyURL(raw); (err == nil) != ok {
			t.Errorf("CheckKeyURL(%q) = %v; want ok %v", raw, err, ok)
		}
	}
}

func TestRefreshAfter(t *testing.T) {
	const lo, hi = time.Minute, time.Hour
	for _, c := range []struct {
		cacheControl, age string
		want              time.Duration
	}{
		{"", "", hi},
		{"public, max-age=600", "", 10 * time.Minute},
		{"max-age=600", "100", 500 * time.Second},
		{"max-age=600", "900", lo},
		{"max-age=5", "", lo},
		{"max-age=86400", "", hi},
		{"max-age=99999999999999999999", "", hi},
		{"MAX-AGE=\"120\"", "", 2 * time.Minute},
		{"no-cache", "", lo},
		{"max-age=600, no-store", "", lo},
		{"max-age=soon", "", hi},
		{"max-age=-5", "", hi},
	} {
		h := http.Header{}
		if c.cacheControl != "" {
			h.Set("Cache-Control", c.cacheControl)
		}
		if c.age != "" {
			h.Set("Age", c.age)
		}
		if got := refreshAfter(h, lo, hi); got != c.want {
			t.Errorf("Cache-Control %q, Age %q: %s; want %s", c.cacheControl, c.age, got, c.want)
		}
	}
}

func TestRemoteOptionsResolve(t *testing.T) {
	ok, err := RemoteOptions{URL: "https://a.example/jwks"}.Resolve()
	if err != nil || ok.RefreshMin != DefaultRefreshMin || ok.RefreshMax != DefaultRefreshMax || ok.MaxStale != DefaultMaxStale ||
		ok.Timeout != DefaultFetchTimeout || ok.MaxSize != DefaultMaxKeySetSize {
		t.Errorf("defaults: %+v, %v", ok, err)
	}
	for _, o := range []RemoteOptions{
		{URL: "http://a.example/jwks"},
		{URL: "https://a.example/jwks", RefreshMin: time.Hour, RefreshMax: time.Minute},
		{URL: "https://a.example/jwks", MaxStale: time.Minute},
		{URL: "https://a.example/jwks", Timeout: -time.Second},
	} {
		if _, err := o.Resolve(); err == nil {
			t.Errorf("%+v resolved", o)
		}
	}
}
