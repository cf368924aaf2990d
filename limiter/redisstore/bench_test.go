package redisstore

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// BenchmarkRedisTake measures one decision, a Lua script run over loopback,
// from parallel goroutines on 1,024 keys.
func BenchmarkRedisTake(b *testing.B) {
	clients := map[string]func() redis.UniversalClient{
		"standalone": func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(b)})
		},
		"cluster": func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(b)})
		},
	}
	for _, name := range []string{"standalone", "cluster"} {
		for _, zones := range []int{1, 3} {
			b.Run(fmt.Sprintf("%s/zones=%d", name, zones), func(b *testing.B) {
				s := newRedisStore(b, clients[name]())
				benchTake(b, s, zones)
			})
		}
	}
}

func benchTake(b *testing.B, s *Store, zones int) {
	benchTakePolicy(b, s, zones, bucket.Policy{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}, 1)
}

// benchTakePolicy takes cost from s for zones zones of policy p, each
// keyed by one of 1,024 keys, from 16 goroutines.
func benchTakePolicy(b *testing.B, s *Store, zones int, p bucket.Policy, cost int64) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	b.ReportAllocs()
	b.SetParallelism(8) // 16 goroutines on 2 CPUs: Redis latency overlaps
	names := []string{"z0", "z1", "z2"}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		reqs := make([]bucket.Request, zones)
		for pb.Next() {
			for z := range reqs {
				// Zone 2 is keyed by something else: another slot in a cluster.
				key := keys[i%len(keys)]
				if z == 2 {
					key = keys[(i+7)%len(keys)] + "x"
				}
				reqs[z] = bucket.Request{Zone: names[z], Key: key, Policy: p, Cost: cost}
			}
			if _, err := s.Take(b.Context(), reqs); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkRedisScript measures what a decision costs Redis: the time of
// the script calls, by algorithm, from the server's INFO commandstats (the
// EVALSHA line's usec), per decision (redis-µs/op), and how many decisions
// a call took on average (decisions/call: batched calls, see joiner.go).
// The store takes from 16 goroutines on 1,024 keys of a standalone Redis,
// so the decisions come in pipelines, as under load.
func BenchmarkRedisScript(b *testing.B) {
	algorithms := []struct {
		name string
		p    bucket.Policy
		cost int64
	}{
		{"token_bucket", bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}, 1},
		{"leaky_bucket", bucket.Policy{Algorithm: bucket.LeakyBucket, Rate: 1_000_000, Period: time.Second, Burst: 1_000_000, NoDelay: true}, 1},
		{"fixed_window", bucket.Policy{Algorithm: bucket.FixedWindow, Rate: 1_000_000_000, Period: time.Minute}, 1},
		{"sliding_window_counter", bucket.Policy{Algorithm: bucket.SlidingWindowCounter, Rate: 1_000_000_000, Period: time.Minute}, 1},
		{"sliding_window_log", bucket.Policy{Algorithm: bucket.SlidingWindowLog, Rate: 1_000, Period: time.Second}, 1},
		// one request of cost 10,000 fills a log of 10,000 (the next ones
		// are refused until it has left the window: a second)
		{"sliding_window_log_cost_10000", bucket.Policy{Algorithm: bucket.SlidingWindowLog, Rate: 10_000, Period: time.Second}, 10_000},
	}
	for _, a := range algorithms {
		b.Run(a.name, func(b *testing.B) {
			c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(b)})
			s := newRedisStore(b, c)
			before := evalshaUsec(b, c)
			benchTakePolicy(b, s, 1, a.p, a.cost)
			after := evalshaUsec(b, c)
			if calls := after[1] - before[1]; calls > 0 {
				b.ReportMetric(float64(after[0]-before[0])/float64(b.N), "redis-µs/op")
				b.ReportMetric(float64(b.N)/float64(calls), "decisions/call")
			}
		})
	}
}

// evalshaUsec is the EVALSHA line of c's INFO commandstats: usec and calls.
func evalshaUsec(b *testing.B, c *redis.Client) [2]int64 {
	info, err := c.Info(b.Context(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var v [2]int64
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			for _, f := range strings.Split(strings.TrimSpace(rest), ",") {
				name, val, _ := strings.Cut(f, "=")
				n, _ := strconv.ParseInt(val, 10, 64)
				switch name {
				case "usec":
					v[0] = n
				case "calls":
					v[1] = n
				}
			}
		}
	}
	return v
}
