package limiter

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
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

func benchTake(b *testing.B, s Store, zones int) {
	p := Policy{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	b.ReportAllocs()
	b.SetParallelism(8) // 16 goroutines on 2 CPUs: Redis latency overlaps
	names := []string{"z0", "z1", "z2"}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		reqs := make([]Request, zones)
		for pb.Next() {
			for z := range reqs {
				// Zone 2 is keyed by something else: another slot in a cluster.
				key := keys[i%len(keys)]
				if z == 2 {
					key = keys[(i+7)%len(keys)] + "x"
				}
				reqs[z] = Request{Zone: names[z], Key: key, Policy: p, Cost: 1}
			}
			if _, err := s.Take(b.Context(), reqs); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
