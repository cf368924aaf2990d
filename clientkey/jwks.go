package clientkey

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
)

// jwk is one key of a JSON Web Key Set (RFC 7517), public parts only.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Crv string `json:"crv"`
	N   string `json:"n"`
	E   string `json:"e"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// LoadJWKSFile reads the public keys of a JWKS file: RSA, EC (P-256,
// P-384, P-521) and OKP (Ed25519) keys. Keys for encryption ("use":"enc"),
// symmetric keys and kinds it does not support are skipped, and said so in
// skipped; a malformed key of a supported kind is an error.
func LoadJWKSFile(path string) (keys []PublicKey, skipped []string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, k := range set.Keys {
		if why := k.unsupported(); why != "" {
			skipped = append(skipped, fmt.Sprintf("key %d (kid %q): %s", i, k.Kid, why))
			continue
		}
		key, err := k.publicKey()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: key %d (kid %q): %w", path, i, k.Kid, err)
		}
		keys = append(keys, PublicKey{ID: k.Kid, Key: key})
	}
	if len(keys) == 0 {
		return nil, skipped, fmt.Errorf("%s: no signature verification key", path)
	}
	return keys, skipped, nil
}

// unsupported says why k is not a key this package verifies with, or "".
func (k jwk) unsupported() string {
	switch {
	case k.Use == "enc":
		return "for encryption"
	case k.Kty == "oct":
		return "symmetric (use secret instead)"
	case k.Kty == "EC" && k.Crv != "P-256" && k.Crv != "P-384" && k.Crv != "P-521":
		return "unsupported curve " + k.Crv
	case k.Kty == "OKP" && k.Crv != "Ed25519":
		return "unsupported curve " + k.Crv
	case k.Kty != "RSA" && k.Kty != "EC" && k.Kty != "OKP":
		return "unsupported kty " + k.Kty
	}
	return ""
}

func (k jwk) publicKey() (any, error) {
	switch k.Kty {
	case "RSA":
		n, e := b64int(k.N), b64int(k.E)
		if n == nil || e == nil || !e.IsInt64() {
			return nil, fmt.Errorf("bad RSA n or e")
		}
		key := &rsa.PublicKey{N: n, E: int(e.Int64())}
		return key, checkRSA(key)
	case "EC":
		return k.ecKey()
	case "OKP":
		x, err := base64.RawURLEncoding.DecodeString(k.X)
		if k.Crv != "Ed25519" || err != nil || len(x) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("bad OKP key (crv %q)", k.Crv)
		}
		return ed25519.PublicKey(x), nil
	}
	return nil, fmt.Errorf("unsupported kty %q", k.Kty)
}

func (k jwk) ecKey() (any, error) {
	curves := map[string]elliptic.Curve{"P-256": elliptic.P256(), "P-384": elliptic.P384(), "P-521": elliptic.P521()}
	curve, ok := curves[k.Crv]
	if !ok {
		return nil, fmt.Errorf("unsupported curve %q", k.Crv)
	}
	size := (curve.Params().BitSize + 7) / 8
	x, errX := base64.RawURLEncoding.DecodeString(k.X)
	y, errY := base64.RawURLEncoding.DecodeString(k.Y)
	if errX != nil || errY != nil || len(x) != size || len(y) != size {
		return nil, fmt.Errorf("bad EC coordinates")
	}
	// The uncompressed point form lets crypto/ecdh check the point is on the curve.
	point := append([]byte{4}, append(x, y...)...)
	key, err := ecdsa.ParseUncompressedPublicKey(curve, point)
	if err != nil {
		return nil, fmt.Errorf("EC point: %w", err)
	}
	return key, nil
}

func b64int(s string) *big.Int {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) == 0 {
		return nil
	}
	return new(big.Int).SetBytes(b)
}
