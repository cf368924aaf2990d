// Package jwkstest is an identity provider for tests: a real local HTTP or
// HTTPS server that serves an OpenID Connect discovery document and a JSON
// Web Key Set of ECDSA keys it signs tokens with. Tests rotate its keys,
// make it fail or answer garbage, and count what it served.
package jwkstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
)

// JWKSPath is where the provider serves its key set; DiscoveryPath its
// discovery document.
const (
	JWKSPath      = "/keys/jwks.json"
	DiscoveryPath = "/.well-known/openid-configuration"
)

// Provider is an identity provider on a local server.
type Provider struct {
	// URL is the server's base URL, and the issuer of its tokens.
	URL string
	// Server is the running server; its Client trusts it.
	Server *httptest.Server
	// JWKSFetches and DiscoveryFetches count the requests served.
	JWKSFetches, DiscoveryFetches atomic.Int64

	mu           sync.Mutex
	keys         map[string]*ecdsa.PrivateKey
	order        []string // kids in the order they were added
	status       int      // answered instead of the set when not 0
	body         []byte   // served instead of the set when not nil
	cacheControl string
	delay        time.Duration // before answering for the key set
	jwksURI      string        // in the discovery document; default URL+JWKSPath
	issuer       string        // in the discovery document; default URL
}

// New starts a provider with one key, "key-1", on loopback: HTTPS when tls,
// else HTTP. It stops when the test ends.
func New(t testing.TB, tls bool) *Provider {
	t.Helper()
	p := &Provider{keys: map[string]*ecdsa.PrivateKey{}}
	mux := http.NewServeMux()
	mux.HandleFunc(JWKSPath, p.serveJWKS)
	mux.HandleFunc(DiscoveryPath, p.serveDiscovery)
	if tls {
		p.Server = httptest.NewTLSServer(mux)
	} else {
		p.Server = httptest.NewServer(mux)
	}
	t.Cleanup(p.Server.Close)
	p.URL = p.Server.URL
	p.AddKey(t, "key-1")
	return p
}

// AddKey makes a new signing key named kid and publishes it.
func (p *Provider) AddKey(t testing.TB, kid string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys[kid] = key
	p.order = append(p.order, kid)
}

// RemoveKey stops publishing kid (its tokens can still be signed).
func (p *Provider) RemoveKey(kid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, k := range p.order {
		if k == kid {
			p.order = append(p.order[:i:i], p.order[i+1:]...)
		}
	}
}

// Sign returns an ES256 token of claims signed with kid's key (key-1's
// for a kid the provider never made), with the provider as issuer and an
// hour to live unless claims say otherwise.
func (p *Provider) Sign(t testing.TB, kid string, claims jwt.MapClaims) string {
	t.Helper()
	p.mu.Lock()
	key := p.keys[kid]
	if key == nil {
		key = p.keys["key-1"]
	}
	p.mu.Unlock()
	c := jwt.MapClaims{"iss": p.URL, "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range claims {
		c[k] = v
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, c)
	tok.Header["kid"] = kid
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Fail makes the key set answer status with no body; 0 serves it again.
func (p *Provider) Fail(status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status = status
}

// Delay makes the key set answer d late (or when the client leaves).
func (p *Provider) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Serve serves body instead of the key set; nil serves the set again.
func (p *Provider) Serve(body []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.body = body
}

// CacheControl sets the Cache-Control header of the key set.
func (p *Provider) CacheControl(v string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cacheControl = v
}

// Discovery sets the issuer and jwks_uri of the discovery document; ""
// leaves the default (URL, and URL+JWKSPath).
func (p *Provider) Discovery(issuer, jwksURI string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.issuer, p.jwksURI = issuer, jwksURI
}

// JWKS is the key set as served, with an encryption key that verifiers
// must skip.
func (p *Provider) JWKS() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	set := jose.JSONWebKeySet{}
	for _, kid := range p.order {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: p.keys[kid].Public(), KeyID: kid, Use: "sig", Algorithm: "ES256"})
	}
	if len(p.order) > 0 {
		enc := p.keys[p.order[0]].Public()
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: enc, KeyID: "enc-1", Use: "enc", Algorithm: "ECDH-ES"})
	}
	data, _ := json.Marshal(set) // ECDSA public keys always marshal
	return data
}

func (p *Provider) serveJWKS(w http.ResponseWriter, r *http.Request) {
	p.JWKSFetches.Add(1)
	p.mu.Lock()
	status, body, cc, delay := p.status, p.body, p.cacheControl, p.delay
	p.mu.Unlock()
	select {
	case <-time.After(delay):
	case <-r.Context().Done():
		return
	}
	if status != 0 {
		w.WriteHeader(status)
		return
	}
	if body == nil {
		body = p.JWKS()
	}
	if cc != "" {
		w.Header().Set("Cache-Control", cc)
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Write(body)
}

func (p *Provider) serveDiscovery(w http.ResponseWriter, r *http.Request) {
	p.DiscoveryFetches.Add(1)
	p.mu.Lock()
	issuer, uri := p.issuer, p.jwksURI
	p.mu.Unlock()
	if issuer == "" {
		issuer = p.URL
	}
	if uri == "" {
		uri = p.URL + JWKSPath
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"issuer": issuer, "jwks_uri": uri})
}

// Clock is a test clock: it stands still until moved.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a clock at t.
func NewClock(t time.Time) *Clock {
	c := new(Clock)
	c.ns.Store(t.UnixNano())
	return c
}

// Now is the clock's time.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) { c.ns.Add(int64(d)) }

// Eventually waits up to 5 s for cond, polling; it fails the test with msg
// if cond never holds.
func Eventually(t testing.TB, msg string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting: " + msg)
		}
	}
}
