package redisstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
)

// TestRedisFootprint measures, per algorithm, the Redis memory of one key
// named as in production (MEMORY USAGE, after 1 and after 100 requests of
// a 100r/m limit) and the Redis commands one decision runs inside its
// script (INFO commandstats).
// The table of commands per decision in BENCHMARKS.md comes from its
// output:
//
//	go test -run TestRedisFootprint -v ./limiter/redisstore
func TestRedisFootprint(t *testing.T) {
	srv := redistest.NewServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	s := memoryStore(t, c)
	ctx := context.Background()
	for _, a := range []bucket.Algorithm{bucket.TokenBucket, bucket.FixedWindow, bucket.SlidingWindowLog, bucket.SlidingWindowCounter, bucket.LeakyBucket, bucket.Concurrency} {
		p := bucket.Policy{Algorithm: a, Rate: 100, Period: time.Minute, Burst: 100, Slots: 100, Lease: time.Minute}
		key := "footprint-" + a.String()
		take := func() { // with a request id as the handler makes them
			if _, err := s.Take(ctx, []bucket.Request{{Zone: "per_ip", Key: key, Policy: p, Cost: 1, ID: rand.Text()}}); err != nil {
				t.Fatal(err)
			}
		}
		take()
		rk := s.key(bucket.Request{Zone: "per_ip", Key: key, Policy: p})
		one, err := c.MemoryUsage(ctx, rk, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for range 99 {
			take()
		}
		calls := scriptCalls(t, c)
		full, _ := c.MemoryUsage(ctx, rk, 0).Result()
		t.Logf("%-24s memory: %4d bytes after 1 request, %5d after 100; commands per decision: %.1f", a, one, full, float64(calls)/99)
		if one > 300 || (a != bucket.SlidingWindowLog && a != bucket.Concurrency && full > 300) || full > 12000 {
			t.Errorf("%s: %d and %d bytes: more than expected", a, one, full)
		}
	}
}

// scriptCalls counts the commands run since the last CONFIG RESETSTAT,
// leaving out the script calls themselves and this test's own commands.
func scriptCalls(t *testing.T, c *redis.Client) int {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || name == "evalsha" || name == "eval" || name == "info" || name == "config|resetstat" || name == "script|load" {
			continue
		}
		calls, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		n += calls
	}
	return n
}

// memoryKeys is how many active keys TestRedisMemoryPerKey makes per
// algorithm.
const memoryKeys = 100_000

// TestRedisMemoryPerKey measures, per algorithm, the Redis memory of an
// active key as production names it (prefix "rl:", a 6-letter zone), after
// one request of a 100r/h limit: MEMORY USAGE of one key, and the growth of
// used_memory (INFO memory) over 100,000 such keys, hash tables and
// expiries included, in a standalone Redis and a cluster of 3 masters of
// its own (a cluster keeps more per key: the slot of each). It holds the
// token bucket to its targets in standalone Redis: 72 and 150 bytes. The
// tables of Redis memory per active key (docs/redis.md, BENCHMARKS.md)
// come from its output:
//
//	go test -run TestRedisMemoryPerKey -v ./limiter/redisstore
func TestRedisMemoryPerKey(t *testing.T) {
	srv := redistest.NewServer(t)
	standalone := []*redis.Client{redis.NewClient(&redis.Options{Addr: srv.Addr})}
	cl := redistest.NewClusterOf(t, 3, 0)
	var cluster []*redis.Client
	for _, addr := range cl.Addrs() {
		cluster = append(cluster, redis.NewClient(&redis.Options{Addr: addr}))
	}
	stores := []*Store{memoryStore(t, standalone[0]), memoryStore(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()}))}
	for _, a := range []bucket.Algorithm{bucket.TokenBucket, bucket.FixedWindow, bucket.SlidingWindowLog, bucket.SlidingWindowCounter, bucket.LeakyBucket, bucket.Concurrency} {
		p := bucket.Policy{Algorithm: a, Rate: 100, Period: time.Hour, Burst: 100, Slots: 100, Lease: time.Hour}
		usage, growth, key := memoryPerKey(t, stores[0], standalone, p)
		cUsage, cGrowth, _ := memoryPerKey(t, stores[1], cluster, p)
		t.Logf("%-22s %-30q MEMORY USAGE %3d B (cluster %3d B); used_memory +%.0f B per key (cluster +%.0f B): %.0f MB per million keys (cluster %.0f MB)",
			a, key, usage, cUsage, growth, cGrowth, growth, cGrowth)
		if a == bucket.TokenBucket && (usage > 72 || growth > 150) {
			t.Errorf("token bucket: MEMORY USAGE %d B, used_memory +%.1f B per key; want at most 72 and 150", usage, growth)
		}
	}
}

// memoryStore is a store on c, a Redis of the test's own, whose keys are
// named as in production (DefaultKeyPrefix).
func memoryStore(t *testing.T, c redis.UniversalClient) *Store {
	s := newRedisStore(t, c)
	s.prefix = DefaultKeyPrefix
	return s
}

// memoryPerKey empties the Redis nodes, makes memoryKeys active keys of p
// in them through s, 1,000 requests to a Take, and returns the MEMORY
// USAGE of one of the keys, the growth of used_memory (all nodes) per key,
// and that key.
func memoryPerKey(t *testing.T, s *Store, nodes []*redis.Client, p bucket.Policy) (int64, float64, string) {
	ctx := t.Context()
	req := func(i int) bucket.Request {
		return bucket.Request{Zone: "per_ip", Key: fmt.Sprint("10.0.", i/256, ".", i%256), Policy: p, Cost: 1, ID: rand.Text()}
	}
	reqs := make([]bucket.Request, 1000)
	for j := range reqs { // loads the script on every node
		reqs[j] = req(-1 - j)
	}
	if _, err := s.TakeAt(ctx, t0, reqs); err != nil {
		t.Fatal(err)
	}
	before, _ := usedMemory(t, nodes, true)
	for i := 0; i < memoryKeys; i += len(reqs) {
		for j := range reqs {
			reqs[j] = req(i + j)
		}
		if _, err := s.TakeAt(ctx, t0, reqs); err != nil {
			t.Fatal(err)
		}
	}
	after, keys := usedMemory(t, nodes, false)
	if keys != memoryKeys {
		t.Fatalf("%d keys; want %d", keys, memoryKeys)
	}
	key := s.key(req(0))
	usage, err := s.client.MemoryUsage(ctx, key, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	return usage, float64(after-before) / memoryKeys, key
}

// usedMemory is the sum of INFO memory's used_memory over nodes, after a
// FLUSHALL when flush is set, and the number of keys they hold.
func usedMemory(t *testing.T, nodes []*redis.Client, flush bool) (used, keys int64) {
	for _, c := range nodes {
		if flush {
			if err := c.FlushAll(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		info, err := c.Info(t.Context(), "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		v, ok := strings.CutPrefix(info[strings.Index(info, "used_memory:"):], "used_memory:")
		n, err := strconv.ParseInt(v[:strings.IndexByte(v, '\r')], 10, 64)
		if !ok || err != nil {
			t.Fatalf("used_memory in INFO memory: %v", err)
		}
		size, err := c.DBSize(t.Context()).Result()
		if err != nil {
			t.Fatal(err)
		}
		used, keys = used+n, keys+size
	}
	return used, keys
}

// TestMemoryFootprint measures the heap a memstore.Store of the default
// capacity takes once full: memstore.DefaultCapacity buckets of distinct
// keys, then as many again, which evict them (a flood of new keys), for a
// token bucket and a sliding log of one request (a 10r/d limit: nothing
// is full again for hours). It holds the store to the bound its default
// promises: 256 B per bucket (the token bucket's figures are 90–184 B:
// Go's maps grow in steps). The memory figures of ARCHITECTURE.md and
// BENCHMARKS.md come from its output:
//
//	go test -run TestMemoryFootprint -v ./limiter/redisstore
func TestMemoryFootprint(t *testing.T) {
	for _, a := range []bucket.Algorithm{bucket.TokenBucket, bucket.SlidingWindowLog} {
		p := bucket.Policy{Algorithm: a, Rate: 10, Period: 24 * time.Hour, Burst: 10}
		s := memstore.New(time.Hour)
		before := heapAlloc()
		take := func(i int) {
			s.TakeAt(t0, []bucket.Request{{Zone: "per_ip", Key: "10." + strconv.Itoa(i), Policy: p, Cost: 1}})
		}
		for i := range memstore.DefaultCapacity {
			take(i)
		}
		full := heapAlloc()
		for i := range memstore.DefaultCapacity {
			take(memstore.DefaultCapacity + i)
		}
		flooded := heapAlloc()
		if n := s.Len(); n > memstore.DefaultCapacity || s.Evictions() != uint64(2*memstore.DefaultCapacity-n) {
			t.Fatalf("%s: Len %d, %d evictions after %d keys", a, n, s.Evictions(), 2*memstore.DefaultCapacity)
		}
		perBucket := func(heap uint64) float64 { return float64(heap-before) / memstore.DefaultCapacity }
		t.Logf("%-18s %d buckets: %.0f B per bucket (%.0f MB); after as many new keys, which evicted them: %.0f B (%.0f MB)",
			a, memstore.DefaultCapacity, perBucket(full), float64(full-before)/1e6, perBucket(flooded), float64(flooded-before)/1e6)
		if perBucket(full) > 256 || perBucket(flooded) > 256 {
			t.Errorf("%s: %.0f and %.0f B per bucket; want at most 256", a, perBucket(full), perBucket(flooded))
		}
		s.Close()
	}
}
