package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/clientkey"
)

// JWTConfig says which tokens to trust and where to find them. At least
// one of Secret, PublicKeyFile, JWKSFile, JWKSURL and Discover is
// required; the keys of all those set are trusted. Tokens must carry exp.
// The accepted algorithms follow from the keys: HS256/384/512 with the
// secret, RS*/PS*, ES* and EdDSA with public keys of their kind; never
// "none", and never an HMAC signature made with a public key.
type JWTConfig struct {
	// Secret verifies HMAC tokens; at least 32 bytes. Placeholders such
	// as {env.JWT_SECRET} work; an unknown placeholder is an error.
	Secret string `json:"secret,omitempty"`

	// PublicKeyFile is a PEM file of RSA, ECDSA or Ed25519 public keys
	// (or certificates).
	PublicKeyFile string `json:"public_key_file,omitempty"`

	// JWKSFile is a JSON Web Key Set file; a token's kid picks the key.
	// Keys this module does not verify with (encryption keys, symmetric
	// keys, other curves) are skipped with a warning; a malformed key is
	// an error.
	JWKSFile string `json:"jwks_file,omitempty"`

	// JWKSURL is the URL of an identity provider's JSON Web Key Set, e.g.
	// https://auth.example.com/.well-known/jwks.json: HTTPS, or HTTP to a
	// loopback host. Its keys are fetched when the config loads (waiting
	// at most FetchTimeout), then in the background: on a schedule that
	// follows the response's Cache-Control max-age within RefreshMin and
	// RefreshMax, and soon after a token names a key ID the set lacks (at
	// most once per RefreshMin). Requests never wait on a fetch. A fetch
	// that fails, or a response that is not a usable key set (or is over
	// 1 MiB), leaves the last keys in use, up to MaxStale. Keys the module
	// does not verify with, or malformed ones, are skipped with a
	// warning. Handlers and config reloads with the same settings share
	// one fetcher.
	JWKSURL string `json:"jwks_url,omitempty"`

	// Discover finds the JWKS URL in Issuer's OpenID Connect discovery
	// document, <issuer>/.well-known/openid-configuration (its jwks_uri,
	// which must be HTTPS too), whose issuer must equal Issuer; its keys
	// are then fetched as JWKSURL says. Needs Issuer (HTTPS, or HTTP to a
	// loopback host); not with JWKSURL. The document is read again after
	// a fetch fails. Default: false.
	Discover bool `json:"discover,omitempty"`

	// RefreshMin is the shortest time between two fetches of the JWKS,
	// whatever asks for them: a short Cache-Control max-age, no-cache,
	// tokens with unknown key IDs, a failed fetch tried again. Only with
	// JWKSURL or Discover. Default: 1m.
	RefreshMin caddy.Duration `json:"refresh_min,omitempty"`

	// RefreshMax is the longest time between two fetches of the JWKS, and
	// the time between them when the response has no Cache-Control
	// max-age. Only with JWKSURL or Discover. Default: 1h.
	RefreshMax caddy.Duration `json:"refresh_max,omitempty"`

	// MaxStale is how long the last keys fetched stay in use while fetches
	// fail; older, they are dropped (logged) and tokens yield no claims
	// until a fetch succeeds. At least RefreshMax. Only with JWKSURL or
	// Discover. Default: 24h.
	MaxStale caddy.Duration `json:"max_stale,omitempty"`

	// FetchTimeout bounds one fetch: the discovery document and the JWKS
	// together. Only with JWKSURL or Discover. Default: 10s.
	FetchTimeout caddy.Duration `json:"fetch_timeout,omitempty"`

	// FromHeader is the request header that carries the token, with or
	// without a "Bearer " prefix. Default: Authorization.
	FromHeader string `json:"from_header,omitempty"`

	// FromCookie reads the token from this cookie instead of a header.
	FromCookie string `json:"from_cookie,omitempty"`

	// Issuer, when set, must equal the token's iss claim. With Discover,
	// it is also where the keys are found.
	Issuer string `json:"issuer,omitempty"`

	// Audience, when set, must be one of the token's aud values.
	Audience string `json:"audience,omitempty"`

	// Leeway tolerates clock differences when checking exp and nbf.
	// Default: 30s.
	Leeway *caddy.Duration `json:"leeway,omitempty"`
}

// provisionJWT loads the keys of h.JWT, if set, and those of its JWKS URL
// (see loadJWKS): it waits for their first fetch, at most fetch_timeout,
// and not at all when a previous config started it. A first fetch that
// fails is logged, and Caddy starts: tokens yield no claims until keys
// arrive.
func (h *Handler) provisionJWT() error {
	if h.JWT == nil {
		return nil
	}
	remote, err := h.loadJWKS()
	if err != nil {
		return fmt.Errorf("jwt: %w", err)
	}
	v, skipped, err := h.JWT.verifier(remote)
	if err != nil {
		h.releaseJWKS() // stops a fetch this config started
		return fmt.Errorf("jwt: %w", err)
	}
	for _, why := range skipped {
		h.logger.Warn("jwks key skipped", zap.String("file", h.JWT.JWKSFile), zap.String("key", why))
	}
	h.verifier = v
	if remote != nil {
		<-remote.Ready()
	}
	return nil
}

// jwtPlaceholder starts the placeholders of verified claims.
const jwtPlaceholder = "http.rate_limit.jwt."

// jwtState holds a request's claims. One provider per request answers the
// {http.rate_limit.jwt.*} placeholders, with the verifier of the rate_limit
// handler running now (handlers in one route may trust different keys), and
// verifies the token at most once per handler, when a claim is first asked
// for. A claim the token does not carry, or a token not accepted, is empty.
type jwtState struct {
	mu      sync.Mutex
	r       *http.Request
	current *Handler
	claims  map[*Handler]map[string]any
}

// jwtStateVar names the request's jwtState among Caddy's request vars.
const jwtStateVar = "rate_limit_jwt_state"

// useClaims makes h the verifier of r's claim placeholders.
func (h *Handler) useClaims(r *http.Request, repl *caddy.Replacer) {
	st, _ := caddyhttp.GetVar(r.Context(), jwtStateVar).(*jwtState)
	if st == nil {
		st = &jwtState{r: r, claims: make(map[*Handler]map[string]any, 1)}
		repl.Map(st.placeholder)
		caddyhttp.SetVar(r.Context(), jwtStateVar, st)
	}
	st.mu.Lock()
	st.current = h
	st.mu.Unlock()
}

// placeholder answers the {http.rate_limit.jwt.<path>} placeholders of
// the request with the claims of its token as the current handler verifies
// it: the claim at path as a string, or "" when the token is not accepted
// or lacks the claim. It verifies the token on the first claim asked for
// per handler, and holds st's lock meanwhile. Other keys are not its own.
func (st *jwtState) placeholder(key string) (any, bool) {
	path, ok := strings.CutPrefix(key, jwtPlaceholder)
	if !ok {
		return nil, false
	}
	st.mu.Lock()
	claims, done := st.claims[st.current]
	if !done {
		claims = st.current.verify(st.r)
		st.claims[st.current] = claims
	}
	st.mu.Unlock()
	v, _ := clientkey.ClaimString(claims, path)
	return v, true
}

// verify returns the claims of r's token, or nil.
func (h *Handler) verify(r *http.Request) map[string]any {
	token := h.JWT.token(r)
	if token == "" {
		return nil
	}
	claims, err := h.verifier.Verify(token, h.now())
	if err != nil {
		h.logger.Debug("jwt not accepted: no claims", zap.Error(err))
		return nil
	}
	return claims
}

// token is the raw token r carries, or "".
func (c *JWTConfig) token(r *http.Request) string {
	if c.FromCookie != "" {
		ck, err := r.Cookie(c.FromCookie)
		if err != nil {
			return ""
		}
		return ck.Value
	}
	v := strings.TrimSpace(r.Header.Get(cmp.Or(c.FromHeader, "Authorization")))
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		v = strings.TrimSpace(v[7:])
	}
	return v
}

// verifier loads the keys of c, and trusts those of remote (nil when c
// has no JWKS URL) too; skipped lists the keys of the JWKS file that it
// cannot use.
func (c *JWTConfig) verifier(remote *clientkey.RemoteKeySet) (v *clientkey.Verifier, skipped []string, err error) {
	if c.FromHeader != "" && c.FromCookie != "" {
		return nil, nil, fmt.Errorf("from: a header or a cookie, not both")
	}
	leeway := defaultLeeway
	if c.Leeway != nil {
		leeway = time.Duration(*c.Leeway)
	}
	if leeway < 0 {
		return nil, nil, fmt.Errorf("leeway %s: must not be negative", leeway)
	}
	keys, skipped, err := c.keys()
	if err != nil {
		return nil, nil, err
	}
	keys.Remote = remote
	v, err = clientkey.NewVerifier(keys, clientkey.VerifierOptions{Issuer: c.Issuer, Audience: c.Audience, Leeway: leeway})
	return v, skipped, err
}

// keys reads the secret and the key files of c.
func (c *JWTConfig) keys() (keys clientkey.Keys, skipped []string, err error) {
	// An unknown placeholder is an error: left as text, it would be a
	// secret anyone can read in the config.
	secret, err := caddy.NewReplacer().ReplaceOrErr(c.Secret, true, true)
	if err != nil {
		return keys, nil, fmt.Errorf("secret: %w", err)
	}
	keys.Secret = []byte(secret)
	if c.PublicKeyFile != "" {
		public, err := clientkey.LoadPublicKeyFile(c.PublicKeyFile)
		if err != nil {
			return keys, nil, err
		}
		keys.Public = public
	}
	if c.JWKSFile != "" {
		public, skip, err := clientkey.LoadJWKSFile(c.JWKSFile)
		if err != nil {
			return keys, nil, err
		}
		keys.Public, skipped = append(keys.Public, public...), skip
	}
	return keys, skipped, nil
}

// defaultLeeway is JWTConfig.Leeway when unset.
const defaultLeeway = 30 * time.Second

// remoteOptions are the resolved settings of c's JWKS URL (or of the one
// it discovers), or nil when it has none.
func (c *JWTConfig) remoteOptions() (*clientkey.RemoteOptions, error) {
	url := c.JWKSURL
	switch {
	case c.JWKSURL != "" && c.Discover:
		return nil, errors.New("jwks_url or discover, not both")
	case c.Discover && c.Issuer == "":
		return nil, errors.New("discover needs issuer: the URL of the identity provider")
	case c.Discover:
		url = c.Issuer
	case c.JWKSURL == "":
		if c.RefreshMin != 0 || c.RefreshMax != 0 || c.MaxStale != 0 || c.FetchTimeout != 0 {
			return nil, errors.New("refresh_min, refresh_max, max_stale and fetch_timeout apply to jwks_url and discover only")
		}
		return nil, nil
	}
	o, err := clientkey.RemoteOptions{URL: url, Discover: c.Discover, Timeout: time.Duration(c.FetchTimeout),
		RefreshMin: time.Duration(c.RefreshMin), RefreshMax: time.Duration(c.RefreshMax), MaxStale: time.Duration(c.MaxStale)}.Resolve()
	if err != nil {
		return nil, err
	}
	o.Now, o.Report = nil, nil // the handler's
	return &o, nil
}
