package clientkey

import (
	"crypto/ecdsa"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
)

// mixedJWKS is a set of two usable keys (one published with its private
// part, wrongly) among keys to skip: malformed ones and kinds not used.
func mixedJWKS(t *testing.T) []byte {
	t.Helper()
	good, err := json.Marshal(jose.JSONWebKey{Key: testKeys.ec.Public(), KeyID: "ec-1", Use: "sig"})
	if err != nil {
		t.Fatal(err)
	}
	private, err := json.Marshal(jose.JSONWebKey{Key: testKeys.other, KeyID: "priv-1", Algorithm: "ES256"})
	if err != nil {
		t.Fatal(err)
	}
	nineByteE := b64([]byte{1, 0, 0, 0, 0, 0, 1, 0, 1}) // 2^64 + 65537: not an int
	return []byte(`{"keys":[` + string(good) + `,` + string(private) + `,
		{"kty":"EC","kid":"bad-1","crv":"P-256","x":"AA","y":"AA"},
		{"kty":"RSA","kid":"big-e","n":"` + b64(testKeys.rsa.N.Bytes()) + `","e":"` + nineByteE + `"},
		{"kty":"RSA","kid":"oaep-1","alg":"RSA-OAEP","n":"` + b64(testKeys.rsa.N.Bytes()) + `","e":"AQAB"},
		{"kty":"oct","kid":"hmac-1","k":"c2VjcmV0"},
		{"kty":"OKP","kid":"x-1","crv":"X25519","x":"` + b64(make([]byte, 32)) + `"},
		"not an object"
	]}`)
}

func TestParseJWKSKeyByKey(t *testing.T) {
	keys, skipped, err := ParseJWKS(mixedJWKS(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0].ID != "ec-1" || keys[1].ID != "priv-1" {
		t.Fatalf("keys %+v; want ec-1 and priv-1", keys)
	}
	if _, ok := keys[1].Key.(*ecdsa.PublicKey); !ok {
		t.Errorf("priv-1 is a %T; want its public half only", keys[1].Key)
	}
	want := []string{`"bad-1"): malformed`, `"big-e"): malformed: RSA exponent`, `"oaep-1"): alg "RSA-OAEP"`,
		`"hmac-1"): symmetric`, `"x-1"): unsupported curve X25519`, `key 7 (kid ""): malformed`}
	if len(skipped) != len(want) {
		t.Fatalf("skipped %q; want %d", skipped, len(want))
	}
	for i, w := range want {
		if !strings.Contains(skipped[i], w) {
			t.Errorf("skipped[%d] = %q; want it to say %s", i, skipped[i], w)
		}
	}
	v, _ := NewVerifier(Keys{Public: keys}, VerifierOptions{})
	if _, err := v.Verify(sign(t, jwt.SigningMethodES256, testKeys.other, claims(nil), "priv-1"), now); err != nil {
		t.Errorf("a token of the key published with its private part: %v", err)
	}
}

func TestLoadJWKSFileRefusesMalformedKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(path, mixedJWKS(t), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadJWKSFile(path); err == nil || !strings.Contains(err.Error(), `kid "bad-1"`) {
		t.Fatalf("LoadJWKSFile of a file with a malformed key among good ones: %v; want an error naming bad-1", err)
	}
}
