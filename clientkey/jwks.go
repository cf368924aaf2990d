package clientkey

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/go-jose/go-jose/v4"
)

// ErrKeySetRejected marks a key set that was read but cannot be used: not
// JSON, not a JWKS, over the size limit, or without a single key this
// package verifies with.
var ErrKeySetRejected = errors.New("key set rejected")

// signatureAlgs are the JWS algorithms a key's "alg" may name for this
// package to use the key: the ones Verify accepts.
var signatureAlgs = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// jwkHead is what is read of a key before go-jose parses it: enough to
// tell a key this package does not use from a malformed one.
type jwkHead struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	Crv string `json:"crv"`
	E   string `json:"e"`
}

// LoadJWKSFile reads the public keys of a JWKS file: RSA, EC (P-256,
// P-384, P-521) and OKP (Ed25519) keys. Keys for encryption, symmetric keys
// and kinds it does not support are skipped, and said so in skipped; a
// malformed key of a supported kind is an error: the file is the
// operator's, and a typo in it should not go unnoticed.
func LoadJWKSFile(path string) (keys []PublicKey, skipped []string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	keys, skipped, err = parseJWKS(data, true)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return keys, skipped, nil
}

// ParseJWKS reads the public keys of a JWKS (RFC 7517), key by key: a key
// of a kind this package does not use, or a malformed one, is skipped and
// said so in skipped, and the others are kept. A set that is not a JWKS, or
// holds no usable key, is an error that wraps ErrKeySetRejected.
func ParseJWKS(data []byte) (keys []PublicKey, skipped []string, err error) {
	return parseJWKS(data, false)
}

// parseJWKS parses data; strict makes a malformed key of a supported kind
// an error rather than a skipped key.
func parseJWKS(data []byte, strict bool) (keys []PublicKey, skipped []string, err error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, nil, fmt.Errorf("%w: not a JWKS: %v", ErrKeySetRejected, err)
	}
	for i, raw := range set.Keys {
		key, unused, err := parseJWK(raw)
		switch {
		case err != nil && strict:
			return nil, nil, fmt.Errorf("%w: key %d (kid %q): %v", ErrKeySetRejected, i, key.ID, err)
		case err != nil:
			skipped = append(skipped, fmt.Sprintf("key %d (kid %q): malformed: %v", i, key.ID, err))
		case unused != "":
			skipped = append(skipped, fmt.Sprintf("key %d (kid %q): %s", i, key.ID, unused))
		default:
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return nil, skipped, fmt.Errorf("%w: no signature verification key", ErrKeySetRejected)
	}
	return keys, skipped, nil
}

// parseJWK parses one key with go-jose. unused says why a well-formed key
// is not one this package verifies with; err says what is wrong with a
// malformed one. key.ID is set in every case where it could be read.
func parseJWK(raw json.RawMessage) (key PublicKey, unused string, err error) {
	var head jwkHead
	if err := json.Unmarshal(raw, &head); err != nil {
		return key, "", err
	}
	key.ID = head.Kid
	if unused = head.unused(); unused != "" {
		return key, unused, nil
	}
	if e, err := base64.RawURLEncoding.DecodeString(head.E); head.Kty == "RSA" && (err != nil || len(e) > 4) {
		return key, "", errors.New("RSA exponent: want a base64url number of at most 4 bytes")
	}
	var jwk jose.JSONWebKey
	if err := jwk.UnmarshalJSON(raw); err != nil {
		return key, "", err
	}
	public := jwk.Public() // a set that (wrongly) holds private parts: their public half
	if !public.Valid() || !public.IsPublic() {
		return key, "", errors.New("not a valid public key")
	}
	key.Key, err = supported(public.Key, nil)
	return key, "", err
}

// unused says why a key is not one this package verifies with, or "".
func (h jwkHead) unused() string {
	switch {
	case h.Use == "enc":
		return "for encryption"
	case h.Kty == "oct":
		return "symmetric (use secret instead)"
	case h.Kty == "EC" && h.Crv != "P-256" && h.Crv != "P-384" && h.Crv != "P-521":
		return "unsupported curve " + h.Crv
	case h.Kty == "OKP" && h.Crv != "Ed25519":
		return "unsupported curve " + h.Crv
	case h.Kty != "RSA" && h.Kty != "EC" && h.Kty != "OKP":
		return fmt.Sprintf("unsupported kty %q", h.Kty)
	case h.Alg != "" && !slices.Contains(signatureAlgs, h.Alg):
		return fmt.Sprintf("alg %q is not a signature algorithm verified here", h.Alg)
	}
	return ""
}
