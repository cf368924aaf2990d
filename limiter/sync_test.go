package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// syncFleet is n Limiters on one Redis under one prefix: n instances.
func syncFleet(t *testing.T, c redis.UniversalClient, n int) []*Limiter {
	t.Helper()
	prefix := fmt.Sprintf("sync%x:", rand.Uint64())
	var fleet []*Limiter
	for range n {
		l, err := NewRedisLimiter(c, RedisOptions{KeyPrefix: prefix, Timeout: 2 * time.Second}, nopNodeEvents{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.sync.close() })
		fleet = append(fleet, l)
	}
	return fleet
}

type nopNodeEvents struct{}

func (nopNodeEvents) BreakerChanged(string, bool) {}
func (nopNodeEvents) NodeGone(string)             {}

// floodSync sends requests of one key as fast as it can through every
// instance of fleet for d, and counts those admitted.
func floodSync(fleet []*Limiter, req Request, d time.Duration) (admitted, sent int64, took time.Duration) {
	var a, s atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, l := range fleet {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var v Verdict
				for time.Since(start) < d {
					l.Decide(context.Background(), time.Time{}, []Request{req}, Caller{Fallback: Fallback{Mode: FallbackDeny}}, &v)
					s.Add(1)
					if v.States[0] == Allowed {
						a.Add(1)
					}
					v.Release()
				}
			}()
		}
	}
	wg.Wait()
	return a.Load(), s.Load(), time.Since(start)
}

// TestSyncOvershootBounded: three instances syncing a zone of 100r/s,
// burst 100, flooded through all three: the fleet admits at most what the
// exact limit admits over the period and one interval more, plus
// (N-1)/N of the burst and of an interval's refill; and most of what it
// may.
var floodFor = 5 * time.Second

func TestSyncOvershootBounded(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	for _, interval := range []time.Duration{100 * time.Millisecond, time.Second} {
		t.Run(interval.String(), func(t *testing.T) {
			fleet := syncFleet(t, c, 3)
			p := Policy{Algorithm: TokenBucket, Rate: 100, Period: time.Second, Burst: 100}
			req := Request{Zone: "api", Key: "flood", Policy: p, Cost: 1, Sync: interval}.WithDigest(nil)
			admitted, sent, took := floodSync(fleet, req, floodFor)
			exact := 100 + 100*took.Seconds()
			bound := exact + 100*interval.Seconds() + 2.0/3*(100+100*interval.Seconds())
			t.Logf("sync %s: %d of %d admitted in %s; exact %.0f, bound %.0f; %d instances seen", interval, admitted, sent, took, exact, bound, fleet[0].Instances())
			if float64(admitted) > bound {
				t.Fatalf("%d admitted, over the bound %.0f", admitted, bound)
			}
			if float64(admitted) < 0.8*exact {
				t.Fatalf("%d admitted, under 80%% of the exact %.0f", admitted, exact)
			}
		})
	}
}
