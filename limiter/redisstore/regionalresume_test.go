package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestRegionalLoneClientCostly: a client of one region alone (no peer
// ever charges its key) of a global token bucket (R = 2, D = 2 s, burst
// 30: 15 a region) whose bucket is full asks for 20 tokens, within the
// exact burst, and, refused, asks again every 3 s (more than D: a
// client that waits out a Retry-After rounded up to whole seconds). The
// exact bucket admits it at once; the region must admit it within a
// bounded time, not refuse it for as long as the client keeps this pace.
func TestRegionalLoneClientCostly(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Hour, Burst: 15} // the share
	take := func(at time.Duration, cost int64) bool {
		t.Helper()
		r := bucket.Request{Zone: "lone", Key: "costly", Policy: p, Cost: cost, Global: true, ID: "G2:2000000"}
		d, err := s.TakeAt(context.Background(), t0.Add(at), []bucket.Request{r})
		if err != nil {
			t.Fatal(err)
		}
		return d[0].Allowed
	}
	take(-9*time.Minute, 1) // known to this region for long; the bucket full again by now
	for at := time.Duration(0); at < 5*time.Minute; at += 3 * time.Second {
		if take(at, 20) {
			return
		}
	}
	t.Errorf("a request of 20 (burst 30, bucket full, no peer) refused every 3 s for 5 minutes")
}

// TestRegionalLoneClientBursts: a client of one region alone sends a
// burst of 30 (the exact burst) every 8 minutes, at a rate of 10 a
// minute a region: its bucket is full each time, no peer ever charges its key. The exact
// bucket admits each burst whole; so must the region that held it, at
// least from the second burst on.
func TestRegionalLoneClientBursts(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 10, Period: time.Minute, Burst: 15} // the share
	for burst := range 3 {
		at := time.Duration(burst) * 8 * time.Minute // within the 10 minutes a region keeps its record
		admitted := 0
		for range 30 {
			r := bucket.Request{Zone: "lone", Key: "bursts", Policy: p, Cost: 1, Global: true, ID: "G2:2000000"}
			d, err := s.TakeAt(context.Background(), t0.Add(at), []bucket.Request{r})
			if err != nil {
				t.Fatal(err)
			}
			if d[0].Allowed {
				admitted++
			}
		}
		if burst > 0 && admitted < 30 {
			t.Errorf("burst %d, its bucket full, no peer: admitted %d; want 30, as the exact bucket", burst, admitted)
		}
	}
}
