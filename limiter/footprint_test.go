package limiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// TestRedisFootprint measures, per algorithm, the Redis memory of one key
// (MEMORY USAGE, after 1 and after 100 requests of a 100r/m limit) and the
// Redis commands one decision runs inside its script (INFO commandstats).
// The README's table comes from its output:
//
//	go test -run TestRedisFootprint -v ./limiter
func TestRedisFootprint(t *testing.T) {
	srv := redistest.NewServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	s := newRedisStore(t, c)
	ctx := context.Background()
	for _, a := range []Algorithm{TokenBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket, Concurrency} {
		p := Policy{Algorithm: a, Rate: 100, Period: time.Minute, Burst: 100, Lease: time.Minute}
		key := "footprint-" + a.String()
		take := func(i int) {
			if _, err := s.Take(ctx, []Request{{Zone: "z", Key: key, Policy: p, Cost: 1, ID: fmt.Sprint("lease-", i)}}); err != nil {
				t.Fatal(err)
			}
		}
		take(0)
		rk := s.key(Request{Zone: "z", Key: key, Policy: p})
		one, err := c.MemoryUsage(ctx, rk, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for i := 1; i < 100; i++ {
			take(i)
		}
		calls := scriptCalls(t, c)
		full, _ := c.MemoryUsage(ctx, rk, 0).Result()
		t.Logf("%-24s memory: %4d bytes after 1 request, %5d after 100; commands per decision: %.1f", a, one, full, float64(calls)/99)
		if one > 300 || (a != SlidingWindowLog && a != Concurrency && full > 300) || full > 12000 {
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
