package ratelimit

import (
	"cmp"
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
// one of Secret, PublicKeyFile and JWKSFile is required. Tokens must carry
// exp. The accepted
// algorithms follow from the keys: HS256/384/512 with the secret, RS*/PS*,
// ES* and EdDSA with public keys of their kind; never "none", and never an
// HMAC signature made with a public key.
type JWTConfig struct {
	// Secret verifies HMAC tokens; at least 32 bytes. Placeholders such
	// as {env.JWT_SECRET} work; an unknown placeholder is an error.
	Secret string `json:"secret,omitempty"`

	// PublicKeyFile is a PEM file of RSA, ECDSA or Ed25519 public keys
	// (or certificates).
	PublicKeyFile string `json:"public_key_file,omitempty"`

	// JWKSFile is a JSON Web Key Set file; a token's kid picks the key.
	JWKSFile string `json:"jwks_file,omitempty"`

	// FromHeader is the request header that carries the token, with or
	// without a "Bearer " prefix. Default: Authorization.
	FromHeader string `json:"from_header,omitempty"`

	// FromCookie reads the token from this cookie instead of a header.
	FromCookie string `json:"from_cookie,omitempty"`

	// Issuer, when set, must equal the token's iss claim.
	Issuer string `json:"issuer,omitempty"`

	// Audience, when set, must be one of the token's aud values.
	Audience string `json:"audience,omitempty"`

	// Leeway tolerates clock differences when checking exp and nbf.
	// Default: 30s.
	Leeway *caddy.Duration `json:"leeway,omitempty"`
}

// provisionJWT loads the keys of h.JWT, if set.
func (h *Handler) provisionJWT() error {
	if h.JWT == nil {
		return nil
	}
	v, skipped, err := h.JWT.verifier()
	if err != nil {
		return fmt.Errorf("jwt: %w", err)
	}
	for _, why := range skipped {
		h.logger.Warn("jwks key skipped", zap.String("file", h.JWT.JWKSFile), zap.String("key", why))
	}
	h.verifier = v
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

// verifier loads the keys of c; skipped lists the keys of the JWKS file
// that it cannot use.
func (c *JWTConfig) verifier() (v *clientkey.Verifier, skipped []string, err error) {
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
