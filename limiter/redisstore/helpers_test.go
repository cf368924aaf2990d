package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// t0 is the tests' clock.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const ms = time.Millisecond

// newRedisStore makes a store with a prefix of its own, so that tests
// sharing a Redis do not see each other's keys.
func newRedisStore(t testing.TB, c redis.UniversalClient) *Store {
	t.Helper()
	s, err := New(c, fmt.Sprintf("test:%x:", rand.Uint64()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// heapAlloc is the live heap after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// readingAt takes r at now in s and returns the remaining.
func readingAt(t *testing.T, s *Store, now time.Time, r bucket.Request) int64 {
	t.Helper()
	got, err := s.TakeAt(context.Background(), now, []bucket.Request{r})
	if err != nil {
		t.Fatal(err)
	}
	return got[0].Remaining
}
