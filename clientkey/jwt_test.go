package clientkey

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// testKeys are signing keys, generated once.
var testKeys = struct {
	secret []byte
	rsa    *rsa.PrivateKey
	ec     *ecdsa.PrivateKey
	ed     ed25519.PrivateKey
	other  *ecdsa.PrivateKey // trusted by nobody
}{secret: []byte("a-32-byte-secret-for-hs256-tests")}

func init() {
	testKeys.rsa, _ = rsa.GenerateKey(rand.Reader, 2048)
	testKeys.ec, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, testKeys.ed, _ = ed25519.GenerateKey(rand.Reader)
	testKeys.other, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

func sign(t testing.TB, m jwt.SigningMethod, key any, claims jwt.MapClaims, kid string) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claims(extra map[string]any) jwt.MapClaims {
	c := jwt.MapClaims{"sub": "user-1", "iss": "https://issuer.example", "aud": "api",
		"exp": now.Add(time.Hour).Unix(), "nbf": now.Add(-time.Minute).Unix()}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

func pemFile(t testing.TB, dir string, keys ...any) string {
	t.Helper()
	var out []byte
	for _, k := range keys {
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	path := filepath.Join(dir, "keys.pem")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func jwksFile(t testing.TB, dir string) string {
	t.Helper()
	pad := func(b []byte, n int) []byte { return append(make([]byte, n-len(b)), b...) }
	set := map[string]any{"keys": []map[string]string{
		{"kty": "RSA", "kid": "rsa-1", "use": "sig", "n": b64(testKeys.rsa.N.Bytes()), "e": b64(big.NewInt(int64(testKeys.rsa.E)).Bytes())},
		{"kty": "EC", "kid": "ec-1", "crv": "P-256", "x": b64(pad(testKeys.ec.X.Bytes(), 32)), "y": b64(pad(testKeys.ec.Y.Bytes(), 32))},
		{"kty": "OKP", "kid": "ed-1", "crv": "Ed25519", "x": b64(testKeys.ed.Public().(ed25519.PublicKey))},
		{"kty": "RSA", "kid": "enc-1", "use": "enc", "n": "AQAB", "e": "AQAB"},
		{"kty": "oct", "kid": "hmac-1", "k": b64([]byte("not trusted for anything"))},
		{"kty": "OKP", "kid": "x-1", "crv": "X25519", "x": b64(make([]byte, 32))},
	}}
	data, _ := json.Marshal(set)
	path := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVerify(t *testing.T) {
	dir := t.TempDir()
	public, err := LoadPublicKeyFile(pemFile(t, dir, testKeys.rsa.Public(), testKeys.ec.Public(), testKeys.ed.Public()))
	if err != nil {
		t.Fatal(err)
	}
	jwks, skipped, err := LoadJWKSFile(jwksFile(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(jwks) != 3 || len(skipped) != 3 {
		t.Fatalf("JWKS: %d keys, %d skipped (%v); want 3 and 3 (encryption, symmetric, X25519 keys)", len(jwks), len(skipped), skipped)
	}
	opts := VerifierOptions{Issuer: "https://issuer.example", Audience: "api", Leeway: 30 * time.Second}
	all, _ := NewVerifier(Keys{Secret: testKeys.secret, Public: public}, opts)
	publicOnly, _ := NewVerifier(Keys{Public: public}, opts)
	fromJWKS, _ := NewVerifier(Keys{Public: jwks}, opts)
	rsaPEM, _ := os.ReadFile(pemFile(t, t.TempDir(), testKeys.rsa.Public()))

	ok := claims(nil)
	cases := []struct {
		name  string
		v     *Verifier
		token string
		valid bool
	}{
		{"HS256", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, ok, ""), true},
		{"HS512", all, sign(t, jwt.SigningMethodHS512, testKeys.secret, ok, ""), true},
		{"RS256", all, sign(t, jwt.SigningMethodRS256, testKeys.rsa, ok, ""), true},
		{"PS256", all, sign(t, jwt.SigningMethodPS256, testKeys.rsa, ok, ""), true},
		{"ES256", all, sign(t, jwt.SigningMethodES256, testKeys.ec, ok, ""), true},
		{"EdDSA", all, sign(t, jwt.SigningMethodEdDSA, testKeys.ed, ok, ""), true},
		{"JWKS RS256 by kid", fromJWKS, sign(t, jwt.SigningMethodRS256, testKeys.rsa, ok, "rsa-1"), true},
		{"JWKS ES256 by kid", fromJWKS, sign(t, jwt.SigningMethodES256, testKeys.ec, ok, "ec-1"), true},
		{"JWKS EdDSA by kid", fromJWKS, sign(t, jwt.SigningMethodEdDSA, testKeys.ed, ok, "ed-1"), true},
		{"JWKS without kid", fromJWKS, sign(t, jwt.SigningMethodES256, testKeys.ec, ok, ""), true},
		{"JWKS unknown kid", fromJWKS, sign(t, jwt.SigningMethodES256, testKeys.ec, ok, "nope"), false},
		{"JWKS kid of another key", fromJWKS, sign(t, jwt.SigningMethodRS256, testKeys.rsa, ok, "ec-1"), false},
		{"JWKS oct key not trusted", fromJWKS, sign(t, jwt.SigningMethodHS256, []byte("not trusted for anything"), ok, "hmac-1"), false},
		{"no exp", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"exp": nil}), ""), false},
		{"expired", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"exp": now.Add(-time.Minute).Unix()}), ""), false},
		{"expired within leeway", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"exp": now.Add(-10 * time.Second).Unix()}), ""), true},
		{"not yet valid", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"nbf": now.Add(time.Minute).Unix()}), ""), false},
		{"wrong issuer", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"iss": "https://evil.example"}), ""), false},
		{"no issuer", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"iss": nil}), ""), false},
		{"wrong audience", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"aud": []string{"web", "admin"}}), ""), false},
		{"one of the audiences", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"aud": []string{"web", "api"}}), ""), true},
		{"forged signature", all, forge(sign(t, jwt.SigningMethodHS256, testKeys.secret, ok, "")), false},
		{"changed payload", all, swapPayload(t, sign(t, jwt.SigningMethodRS256, testKeys.rsa, ok, ""), claims(map[string]any{"sub": "admin"})), false},
		{"untrusted key", all, sign(t, jwt.SigningMethodES256, testKeys.other, ok, ""), false},
		{"alg none", all, sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, ok, ""), false},
		{"HMAC signed with the RSA public key", all, sign(t, jwt.SigningMethodHS256, rsaPEM, ok, ""), false},
		{"HMAC signed with the RSA public key, no secret", publicOnly, sign(t, jwt.SigningMethodHS256, rsaPEM, ok, ""), false},
		{"HS256 without a secret configured", publicOnly, sign(t, jwt.SigningMethodHS256, testKeys.secret, ok, ""), false},
		{"garbage", all, "not.a.token", false},
		{"empty", all, "", false},
		{"two dots", all, "..", false},
		{"64 KB", all, strings.Repeat("a", 64<<10), false},
		{"64 KB of claims", all, sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"pad": strings.Repeat("x", 64<<10)}), ""), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.v.Verify(c.token, now)
			if c.valid && (err != nil || got["sub"] != "user-1") {
				t.Fatalf("refused a valid token: %v (claims %v)", err, got)
			}
			if !c.valid && (err == nil || got != nil) {
				t.Fatalf("accepted: claims %v", got)
			}
		})
	}
}

// forge changes the last character of the signature.
func forge(token string) string {
	last := token[len(token)-1]
	if last == 'A' {
		return token[:len(token)-1] + "B"
	}
	return token[:len(token)-1] + "A"
}

// swapPayload keeps the header and signature and puts other claims in.
func swapPayload(t *testing.T, token string, c jwt.MapClaims) string {
	parts := strings.Split(token, ".")
	payload, _ := json.Marshal(c)
	return parts[0] + "." + b64(payload) + "." + parts[2]
}

func TestNewVerifierNeedsAKey(t *testing.T) {
	if _, err := NewVerifier(Keys{}, VerifierOptions{}); err == nil {
		t.Fatal("a verifier without keys")
	}
	if _, err := NewVerifier(Keys{Secret: []byte("short")}, VerifierOptions{}); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Fatalf("a 5-byte secret: %v", err)
	}
	// The zero Verifier accepts nothing, not even HMAC with an empty key.
	tok := sign(t, jwt.SigningMethodHS256, []byte{}, claims(nil), "")
	if c, err := new(Verifier).Verify(tok, now); err == nil || c != nil {
		t.Fatal("the zero Verifier accepted an HMAC token with an empty key")
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	priv, _ := x509.MarshalECPrivateKey(testKeys.ec)
	for name, path := range map[string]string{
		"missing":     filepath.Join(dir, "nope.pem"),
		"empty":       write("empty.pem", ""),
		"private key": write("priv.pem", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: priv}))),
		"bad der":     write("bad.pem", string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("x")}))),
	} {
		if _, err := LoadPublicKeyFile(path); err == nil {
			t.Errorf("LoadPublicKeyFile(%s): no error", name)
		}
	}
	for name, body := range map[string]string{
		"not json":    "{",
		"no keys":     `{"keys":[]}`,
		"bad rsa":     `{"keys":[{"kty":"RSA","n":"!!","e":"AQAB"}]}`,
		"bad curve":   `{"keys":[{"kty":"EC","crv":"P-192","x":"AA","y":"AA"}]}`,
		"off curve":   `{"keys":[{"kty":"EC","crv":"P-256","x":"` + b64(make([]byte, 32)) + `","y":"` + b64(make([]byte, 32)) + `"}]}`,
		"only x25519": `{"keys":[{"kty":"OKP","crv":"X25519","x":"AA"}]}`,
		"bad okp":     `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AA"}]}`,
		"small rsa":   `{"keys":[{"kty":"RSA","n":"` + b64(make([]byte, 128)) + `","e":"AQAB"}]}`,
		"even e":      `{"keys":[{"kty":"RSA","n":"` + b64(testKeys.rsa.N.Bytes()) + `","e":"Ag"}]}`,
		"unknown kty": `{"keys":[{"kty":"XYZ"}]}`,
	} {
		if _, _, err := LoadJWKSFile(write("jwks.json", body)); err == nil {
			t.Errorf("LoadJWKSFile(%s): no error", name)
		}
	}
}

func TestClaim(t *testing.T) {
	v, _ := NewVerifier(Keys{Secret: testKeys.secret}, VerifierOptions{})
	c, err := v.Verify(sign(t, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{
		"org":        map[string]any{"id": "org-7", "tier": map[string]any{"name": "pro"}},
		"plan.name":  "dotted",
		"big":        json.Number("12345678901234567890"),
		"n":          42,
		"admin":      true,
		"roles":      []string{"a", "b"},
		"fractional": 1.5,
	}), ""), now)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"sub": "user-1", "org.id": "org-7", "org.tier.name": "pro", "plan.name": "dotted",
		"big": "12345678901234567890", "n": "42", "admin": "true", "fractional": "1.5"}
	for path, w := range want {
		if got, ok := ClaimString(c, path); !ok || got != w {
			t.Errorf("ClaimString(%q) = %q, %v; want %q", path, got, ok, w)
		}
	}
	for _, path := range []string{"roles", "org", "org.nope", "nope", "sub.x", ""} {
		if got, ok := ClaimString(c, path); ok {
			t.Errorf("ClaimString(%q) = %q; want not found", path, got)
		}
	}
	if _, ok := ClaimString(nil, "sub"); ok {
		t.Error("a claim of no claims")
	}
}

// FuzzVerify: no input panics, and an accepted token carries a valid
// HS256 signature of its header and payload with the secret.
func FuzzVerify(f *testing.F) {
	v, _ := NewVerifier(Keys{Secret: testKeys.secret}, VerifierOptions{Leeway: time.Minute})
	f.Add(sign(f, jwt.SigningMethodHS256, testKeys.secret, claims(nil), ""))
	f.Add(sign(f, jwt.SigningMethodHS256, testKeys.secret, claims(map[string]any{"exp": "soon"}), ""))
	f.Add(sign(f, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims(nil), ""))
	f.Add(sign(f, jwt.SigningMethodHS256, []byte("wrong"), claims(nil), ""))
	f.Add("eyJhbGciOiJIUzI1NiJ9.e30.")
	f.Add("....")
	f.Add("Bearer x.y.z")
	f.Fuzz(func(t *testing.T, token string) {
		c, err := v.Verify(token, now)
		if err != nil {
			if c != nil {
				t.Fatal("claims with an error")
			}
			return
		}
		parts := strings.Split(token, ".")
		if len(parts) != 3 {
			t.Fatalf("accepted %q: not three parts", token)
		}
		mac := hmac.New(crypto.SHA256.New, testKeys.secret)
		mac.Write([]byte(parts[0] + "." + parts[1]))
		sig, err := base64.RawURLEncoding.DecodeString(parts[2])
		if err != nil || !hmac.Equal(sig, mac.Sum(nil)) {
			t.Fatalf("accepted %q without a valid signature", token)
		}
	})
}
