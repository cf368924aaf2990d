package fleetsync

// The files of a storage fleet signed with the fleet's secret
// (StorageOptions.Secret), and their parsing (see storage.go for the
// model, storagefiles.go for their reading).
//
// A signed file is the JSON of its StorageFile, its last field "mac":
//
//	{"v":1,"instance":"…","at":…,"until":…,"buckets":[…],"mac":"<64 hex digits>"}
//
// the MAC being HMAC-SHA-256, under a key derived from the secret
// (macKey: not the key of the client keys' digests), of the file's bytes
// without it: {"v":1,…,"buckets":[…]}. It covers every byte a reader
// uses, so the format's version, the instance's name, its write time,
// whether it stopped, and every count (zone, algorithm, digest, window);
// a reader checks it (constant time) on the bytes read, before it parses
// them. A reader with no secret ignores "mac".

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/jsonerr"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// macDomain is what the files' key is derived with, from the secret.
const macDomain = "caddy-rate-limit fleetsync storage file MAC v1"

// macPrefix begins a signed file's last field; macLen is that field's
// length, the closing brace included.
const (
	macPrefix = `,"mac":"`
	macLen    = len(macPrefix) + 2*sha256.Size + len(`"}`)
)

// macKey is the key of the files' MACs under secret; nil without one.
func macKey(secret string) []byte {
	if secret == "" {
		return nil
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(macDomain))
	return m.Sum(nil)
}

// mac is the MAC of b under key.
func mac(key, b []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return m.Sum(nil)
}

// sign is b, a JSON object, with its MAC under key as its last field.
func sign(key, b []byte) []byte {
	sum := hex.EncodeToString(mac(key, b))
	out := make([]byte, 0, len(b)-1+macLen)
	out = append(out, b[:len(b)-1]...)
	return append(append(append(out, macPrefix...), sum...), `"}`...)
}

// Errors of a file not signed with the fleet's secret.
var (
	errUnsigned = errors.New("not signed: the fleet has a secret (key_secret), and every instance signs its file with it; ignored")
	errBadMAC   = errors.New("its signature is not the fleet's secret's (another secret, or the file was altered); ignored")
)

// verify checks b's MAC under key and returns the bytes it signs.
func verify(key, b []byte) ([]byte, error) {
	n := len(b) - macLen
	if n < 1 || string(b[n:n+len(macPrefix)]) != macPrefix || b[len(b)-2] != '"' || b[len(b)-1] != '}' {
		return nil, errUnsigned
	}
	got, err := hex.DecodeString(string(b[n+len(macPrefix) : len(b)-2]))
	if err != nil {
		return nil, errUnsigned
	}
	signed := append(b[:n:n], '}') // a copy: b[:n] is not written
	if !hmac.Equal(got, mac(key, signed)) {
		return nil, errBadMAC
	}
	return signed, nil
}

// parseFile checks b, the file of instance inst, signed under key (nil:
// no secret), and parses it.
func parseFile(b []byte, inst string, key []byte) (StorageFile, error) {
	var file StorageFile
	if key != nil {
		signed, err := verify(key, b)
		if err != nil {
			return file, contentError{err}
		}
		b = signed
	}
	if err := json.Unmarshal(b, &file); err != nil {
		return file, contentError{errors.New(jsonerr.Describe(err))}
	}
	switch {
	case file.Version != 1:
		return file, contentError{fmt.Errorf("version %d: want 1 (written by another version?)", file.Version)}
	case file.Instance != inst:
		return file, contentError{errors.New("the instance in the file is not the file's (a copy of another instance's file?)")}
	}
	for _, c := range file.Buckets {
		if _, ok := c.bucketID(); !ok || c.Period <= 0 || c.Curr < 0 || c.Prev < 0 || c.Curr > bucket.MaxCost || c.Prev > bucket.MaxCost {
			return file, contentError{errors.New("a bucket's counts are malformed")}
		}
	}
	return file, nil
}

// bucketID is the bucket c counts, false when c does not name one.
func (c StorageCounts) bucketID() (bucket.ID, bool) {
	algo, err := bucket.ParseAlgorithm(c.Algo)
	h, herr := hex.DecodeString(c.Digest)
	if err != nil || herr != nil || len(h) != 16 || c.Zone == "" {
		return bucket.ID{}, false
	}
	return bucket.ID{Zone: c.Zone, Algo: algo, Hash: [16]byte(h)}, true
}
