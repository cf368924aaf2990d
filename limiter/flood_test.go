package limiter

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// floodKeys is how many distinct client keys a flood brings.
const floodKeys = 100_000

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestMemoryKeyFlood: 100,000 distinct keys (1 KB each) fill the memory
// store with digests, not keys, and the sweeper gives the memory back once
// their buckets are full again.
func TestMemoryKeyFlood(t *testing.T) {
	s := memstore.New(time.Hour)
	defer s.Close()
	p := Policy{Rate: 10, Period: time.Second, Burst: 1}
	pad := strings.Repeat("k", 1<<10)
	before := heapAlloc()
	for i := range floodKeys {
		s.TakeAt(t0, []Request{{Zone: "z", Key: fmt.Sprint(pad, i), Policy: p, Cost: 1}})
	}
	full := heapAlloc()
	if n := s.Len(); n != floodKeys {
		t.Fatalf("Len = %d; want %d", n, floodKeys)
	}
	// Well under the 100 MB of raw keys: about 100 bytes a bucket.
	if grown := full - before; grown > 30<<20 {
		t.Fatalf("100,000 buckets of 1 KB keys take %d MB", grown>>20)
	}
	s.Sweep(t0.Add(time.Second))
	if n := s.Len(); n != 0 {
		t.Fatalf("Len after the buckets refilled = %d; want 0", n)
	}
	if after := heapAlloc(); after > before+(2<<20) {
		t.Fatalf("heap %d MB after the sweep, %d MB before the flood: not given back", after>>20, before>>20)
	}
}

// TestRedisKeyFlood: 100,000 distinct keys each get a TTL of the time to
// refill, and Redis drops them when it passes.
func TestRedisKeyFlood(t *testing.T) {
	srv := redistest.NewServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32})
	s := newRedisStore(t, c)
	p := Policy{Rate: 2, Period: time.Second, Burst: 1} // full again after 500 ms
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < floodKeys; i += 32 {
				if _, err := s.Take(context.Background(), []Request{{Zone: "z", Key: fmt.Sprint("flood-", i), Policy: p, Cost: 1}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Every key still there expires within the time to refill (a key
	// with no expiry would have PTTL -1).
	keys, _, err := c.Scan(ctx, 0, "*", 1000).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if ttl, err := c.PTTL(ctx, k).Result(); err == nil && ttl == -1 || ttl > 500*time.Millisecond {
			t.Fatalf("key %s: PTTL %s; want an expiry within 500ms", k, ttl)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n < floodKeys/100 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d keys still in Redis 20s after their buckets refilled", n, floodKeys)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// FuzzRedisKey: whatever the client key, the Redis key has one length,
// one hash tag (the digest), and differs from the keys of other clients.
func FuzzRedisKey(f *testing.F) {
	s, err := redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "rl:")
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	want := len(s.Key("zone", ""))
	for _, k := range []string{"", "{", "}", "{a}", "}{", "x{y}z", "héllo", "\x00", strings.Repeat("{", 100)} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		rk := s.Key("zone", key)
		if len(rk) != want {
			t.Fatalf("key of %q has length %d; want %d", key, len(rk), want)
		}
		open, close := strings.IndexByte(rk, '{'), strings.IndexByte(rk, '}')
		if open != len("rl:") || close != open+17 || strings.Count(rk, "{") != 1 {
			t.Fatalf("key %q: the hash tag is not the digest alone", rk)
		}
		if key != "x" && rk == s.Key("zone", "x") {
			t.Fatalf("%q and \"x\" share a key", key)
		}
	})
}
