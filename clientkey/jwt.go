// Package clientkey names clients: it verifies JWTs and reads their claims,
// with keys from files or fetched from a JWKS URL (remote.go), and groups
// IP addresses into subnets. It knows nothing of Caddy.
package clientkey

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// MaxTokenSize is the longest token Verify reads; longer ones are refused
// unread.
const MaxTokenSize = 16 << 10

// MinSecretSize is the shortest HMAC secret accepted: as long as the
// output of SHA-256.
const MinSecretSize = 32

// MinRSABits is the smallest RSA modulus accepted.
const MinRSABits = 2048

// Keys are the keys that may sign accepted tokens.
type Keys struct {
	// Secret verifies HS256, HS384 and HS512 tokens.
	Secret []byte
	// Public keys verify RS*, PS*, ES* and EdDSA tokens: *rsa.PublicKey,
	// *ecdsa.PublicKey or ed25519.PublicKey, by key ID ("" when none).
	Public []PublicKey
	// Remote holds more public keys, fetched from a JWKS URL; they change
	// as it refreshes them.
	Remote *RemoteKeySet
}

// PublicKey is a public key and its key ID (from a JWKS), if any.
type PublicKey struct {
	ID  string
	Key any
}

// Verifier checks tokens: signature, expiry (required), not-before,
// issuer, audience.
type Verifier struct {
	keys    Keys
	methods []string
	opts    []jwt.ParserOption
}

// VerifierOptions are the claim checks of a Verifier.
type VerifierOptions struct {
	// Issuer, when set, must equal the token's iss.
	Issuer string
	// Audience, when set, must be one of the token's aud.
	Audience string
	// Leeway tolerates clock differences in exp and nbf.
	Leeway time.Duration
}

// NewVerifier returns a verifier for tokens signed by keys. The accepted
// algorithms follow from the keys: HMAC only with the secret, the others
// only with public keys of their kind, never "none".
func NewVerifier(keys Keys, o VerifierOptions) (*Verifier, error) {
	if n := len(keys.Secret); n > 0 && n < MinSecretSize {
		return nil, fmt.Errorf("secret of %d bytes: want at least %d (RFC 7518, section 3.2)", n, MinSecretSize)
	}
	v := &Verifier{keys: keys, methods: methodsFor(keys)}
	if keys.Remote != nil {
		// Fetched keys come and go, of any kind: key matches a token's
		// algorithm with the keys of its kind when it is verified.
		v.methods = append(v.methods, signatureAlgs...)
	}
	if len(v.methods) == 0 {
		return nil, errors.New("no key: set a secret, a public key file, a JWKS file or a JWKS URL")
	}
	v.opts = []jwt.ParserOption{jwt.WithValidMethods(v.methods), jwt.WithJSONNumber(), jwt.WithLeeway(o.Leeway),
		jwt.WithExpirationRequired()}
	if o.Issuer != "" {
		v.opts = append(v.opts, jwt.WithIssuer(o.Issuer))
	}
	if o.Audience != "" {
		v.opts = append(v.opts, jwt.WithAudience(o.Audience))
	}
	return v, nil
}

func methodsFor(keys Keys) []string {
	var m []string
	if len(keys.Secret) > 0 {
		m = append(m, "HS256", "HS384", "HS512")
	}
	kinds := map[string]bool{}
	for _, k := range keys.Public {
		switch k.Key.(type) {
		case *rsa.PublicKey:
			kinds["rsa"] = true
		case *ecdsa.PublicKey:
			kinds["ec"] = true
		case ed25519.PublicKey:
			kinds["ed"] = true
		}
	}
	if kinds["rsa"] {
		m = append(m, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
	}
	if kinds["ec"] {
		m = append(m, "ES256", "ES384", "ES512")
	}
	if kinds["ed"] {
		m = append(m, "EdDSA")
	}
	return m
}

// Verify checks token at now and returns its claims. A token that fails
// any check yields no claims and an error saying why. It never waits on a
// fetch of remote keys: a token whose key ID they lack asks for one
// (Refetch), and is refused.
func (v *Verifier) Verify(token string, now time.Time) (map[string]any, error) {
	if len(token) > MaxTokenSize {
		return nil, fmt.Errorf("token of %d bytes is over %d", len(token), MaxTokenSize)
	}
	var remote *keySnapshot
	if v.keys.Remote != nil {
		remote = v.keys.Remote.current()
	}
	opts := append(v.opts[:len(v.opts):len(v.opts)], jwt.WithTimeFunc(func() time.Time { return now }))
	claims := jwt.MapClaims{}
	t, err := jwt.NewParser(opts...).ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) {
		return v.key(t, remote)
	})
	if err != nil {
		return nil, err
	}
	if !t.Valid {
		return nil, errors.New("invalid token")
	}
	return claims, nil
}

// key gives the parser the keys that may have signed t: the secret for
// HMAC, public keys of the token's kind (and key ID) otherwise, from the
// keys given and those fetched (remote, which may be nil).
func (v *Verifier) key(t *jwt.Token, remote *keySnapshot) (any, error) {
	if _, ok := t.Method.(*jwt.SigningMethodHMAC); ok {
		if len(v.keys.Secret) == 0 {
			return nil, errors.New("no secret for HMAC")
		}
		return v.keys.Secret, nil
	}
	kid, _ := t.Header["kid"].(string)
	var set jwt.VerificationKeySet
	public := v.keys.Public
	if remote != nil {
		public = append(public[:len(public):len(public)], remote.keys...)
	}
	for _, k := range public {
		if matches(t.Method, k.Key) && (kid == "" || k.ID == "" || k.ID == kid) {
			set.Keys = append(set.Keys, k.Key)
		}
	}
	if len(set.Keys) > 0 {
		return set, nil
	}
	if v.keys.Remote != nil && kid != "" {
		v.keys.Remote.Refetch() // a rotated key, perhaps
	}
	if v.keys.Remote != nil && remote == nil {
		return nil, errNoKeys
	}
	return nil, fmt.Errorf("no key for alg %s, kid %q", t.Method.Alg(), kid)
}

func matches(m jwt.SigningMethod, key any) bool {
	switch m.(type) {
	case *jwt.SigningMethodRSA, *jwt.SigningMethodRSAPSS:
		_, ok := key.(*rsa.PublicKey)
		return ok
	case *jwt.SigningMethodECDSA:
		_, ok := key.(*ecdsa.PublicKey)
		return ok
	case *jwt.SigningMethodEd25519:
		_, ok := key.(ed25519.PublicKey)
		return ok
	}
	return false
}

// LoadPublicKeyFile reads a PEM file of one or more public keys (PKIX
// "PUBLIC KEY", PKCS#1 "RSA PUBLIC KEY", or certificates).
func LoadPublicKeyFile(path string) ([]PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys []PublicKey
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		key, err := parsePEMBlock(block)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		keys = append(keys, PublicKey{Key: key})
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no PEM public key found", path)
	}
	return keys, nil
}

func parsePEMBlock(b *pem.Block) (any, error) {
	switch b.Type {
	case "PUBLIC KEY":
		return supported(x509.ParsePKIXPublicKey(b.Bytes))
	case "RSA PUBLIC KEY":
		return supported(x509.ParsePKCS1PublicKey(b.Bytes))
	case "CERTIFICATE":
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		return supported(cert.PublicKey, nil)
	}
	return nil, fmt.Errorf("PEM block %q is not a public key", b.Type)
}

func supported(key any, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *rsa.PublicKey:
		return k, checkRSA(k)
	case *ecdsa.PublicKey, ed25519.PublicKey:
		return key, nil
	}
	return nil, fmt.Errorf("unsupported public key type %T", key)
}

// checkRSA refuses RSA keys that Go would not verify with, or should not.
func checkRSA(k *rsa.PublicKey) error {
	if k.N.BitLen() < MinRSABits {
		return fmt.Errorf("RSA key of %d bits: want at least %d", k.N.BitLen(), MinRSABits)
	}
	if k.E < 3 || k.E > 1<<31-1 || k.E%2 == 0 {
		return fmt.Errorf("RSA exponent %d: want an odd number from 3 to 2^31-1", k.E)
	}
	return nil
}

// ClaimString looks up a claim by path: "sub", or "org.id" for the id inside the
// org object. A claim whose own name holds dots is found too. Strings come
// as they are, numbers and booleans in their JSON form; objects and arrays
// are not keys, and are not found.
func ClaimString(claims map[string]any, path string) (string, bool) {
	if v, ok := claims[path]; ok {
		return scalar(v)
	}
	head, rest, ok := strings.Cut(path, ".")
	if !ok {
		return "", false
	}
	inner, ok := claims[head].(map[string]any)
	if !ok {
		return "", false
	}
	return ClaimString(inner, rest)
}

func scalar(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		return v.String(), true
	case bool:
		return strconv.FormatBool(v), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	}
	return "", false
}
