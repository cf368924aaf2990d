package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// BenchmarkSyncRound measures what a sync round costs Redis per bucket
// it charges: the charges of 10,000 token buckets, sent as fleetsync's
// round sends them (Groups, then ChargeAll of each part), each as of its
// last request 1 to 2 ms before. far: buckets far under their limit (a
// billion a second), charged 80 to 92 each (the load test's synced route
// carried 86 requests a bucket), which each charge finds refilled; near:
// buckets of 4 a second, charged 1 to 3, which each charge finds spent.
// It reports, from INFO commandstats (every master's, in a cluster), the
// script calls' time per bucket (redis-µs/bucket) and the buckets a call
// charged (buckets/call). Before the loop, one round charges every bucket
// once, as the keys' first, exact requests make them.
func BenchmarkSyncRound(b *testing.B) {
	for _, where := range []string{"standalone", "cluster"} {
		for _, load := range []string{"far", "near"} {
			b.Run(where+"/"+load, func(b *testing.B) {
				var c redis.UniversalClient
				if where == "standalone" {
					c = redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(b)})
				} else {
					c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(b)})
				}
				b.Cleanup(func() { c.Close() })
				s := newRedisStore(b, c)
				reqs := roundRequests(load == "far")
				syncRound(b, s, reqs)
				before := masterStats(b, c)
				for b.Loop() {
					syncRound(b, s, reqs)
				}
				after := masterStats(b, c)
				if calls := after[1] - before[1]; calls > 0 {
					n := float64(b.N * len(reqs))
					b.ReportMetric(float64(after[0]-before[0])/n, "redis-µs/bucket")
					b.ReportMetric(n/float64(calls), "buckets/call")
				}
			})
		}
	}
}

// roundRequests are the 10,000 charges of a round of BenchmarkSyncRound,
// as the round sends them: the bucket's digest without its key, the
// cost admitted, and the age of its last request as the id.
func roundRequests(far bool) []bucket.Request {
	p, cost := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 4, Period: time.Second, Burst: 4}, func(i int) int64 { return 1 + int64(i%3) }
	if far {
		p.Rate, p.Burst, cost = 1_000_000_000, 1_000_000_000, func(i int) int64 { return 80 + int64(i%13) }
	}
	reqs := make([]bucket.Request, 10_000)
	for i := range reqs {
		reqs[i] = bucket.Request{Zone: "z", Key: fmt.Sprint("client-", i), Policy: p, Cost: cost(i), Sync: 100 * time.Millisecond}.WithDigest(nil)
		reqs[i].Key, reqs[i].ID = "", fmt.Sprint("a", 1000+i%997)
	}
	return reqs
}

// syncRound charges reqs as a round of fleetsync does: in parts of
// Groups, each charged with ChargeAll.
func syncRound(b *testing.B, s *Store, reqs []bucket.Request) {
	for _, part := range s.Groups(context.Background(), reqs) {
		if _, err := s.ChargeAll(context.Background(), bucket.Pick(reqs, part)); err != nil {
			b.Fatal(err)
		}
	}
}

// masterStats is the EVALSHA line of INFO commandstats, usec and calls,
// summed over c's masters (c itself for a standalone Redis).
func masterStats(b *testing.B, c redis.UniversalClient) [2]int64 {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return evalshaUsec(b, c.(*redis.Client))
	}
	var mu sync.Mutex
	var sum [2]int64
	err := cc.ForEachMaster(b.Context(), func(_ context.Context, m *redis.Client) error {
		v := evalshaUsec(b, m)
		mu.Lock()
		sum[0], sum[1] = sum[0]+v[0], sum[1]+v[1]
		mu.Unlock()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return sum
}
