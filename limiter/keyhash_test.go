package limiter

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"sync"
	"testing"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestKeyHasher: nil is KeyHash; a secret gives the HMAC-SHA-256 of the
// key (its first 16 bytes), the same from every goroutine, and another
// secret another digest.
func TestKeyHasher(t *testing.T) {
	var none *KeyHasher
	if none.Sum("client") != bucket.KeyHash("client") || bucket.NewKeyHasher("") != nil {
		t.Fatal("no secret: want KeyHash")
	}
	h := bucket.NewKeyHasher("0123456789abcdef")
	mac := hmac.New(sha256.New, []byte("0123456789abcdef"))
	mac.Write([]byte("client"))
	want := [16]byte(mac.Sum(nil))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if got := h.Sum("client"); got != want {
					t.Errorf("Sum = %x; want %x", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if bucket.NewKeyHasher("0123456789abcdeF").Sum("client") == want || want == bucket.KeyHash("client") {
		t.Fatal("another secret, or none, gives the same digest")
	}
}

// BenchmarkKeyHash: the digest of a client key, by SHA-256 alone
// (KeyHash) and keyed by a secret (KeyHasher, key_secret).
func BenchmarkKeyHash(b *testing.B) {
	key := "203.0.113.195"
	b.Run("sha256", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bucket.KeyHash(key)
		}
	})
	h := bucket.NewKeyHasher("0123456789abcdef")
	b.Run("hmac", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h.Sum(key)
		}
	})
	b.Run("process", func(b *testing.B) { // the memory store alone
		b.ReportAllocs()
		for b.Loop() {
			bucket.ProcessKeyHasher.Sum(key)
		}
	})
}

// TestProcessKeyHasher: the memory store's digests are stable within the
// process, differ between keys, and are not SHA-256's (which Redis key
// names use, the same in every instance).
func TestProcessKeyHasher(t *testing.T) {
	h := bucket.ProcessKeyHasher
	seen := map[[16]byte]string{}
	for i := range 100000 {
		k := fmt.Sprint("client-", i)
		d := h.Sum(k)
		if d != h.Sum(k) {
			t.Fatalf("%q: two digests", k)
		}
		if other, dup := seen[d]; dup {
			t.Fatalf("%q and %q share a digest", k, other)
		}
		seen[d] = k
	}
	if h.Sum("a") == bucket.KeyHash("a") || h.Sum("") == h.Sum("\x00") {
		t.Fatal("process digests are SHA-256's, or blind to a NUL")
	}
}
