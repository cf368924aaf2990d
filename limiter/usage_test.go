package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
)

// TestQuotaUsage: the listing of a quota's usage gives the keys that used
// the most of this period, most first, in memory, standalone Redis and a
// Cluster (whose keys are on every master); a count of another period
// (another time zone's day) is none of this one's.
func TestQuotaUsage(t *testing.T) {
	p := withCalendar(Policy{Algorithm: Quota, Rate: 100, Burst: 100})
	type lister func(zone string, p Policy, n int) []bucket.Use
	stores := map[string]func(t *testing.T) (takeAtFunc, lister){
		"memory": func(t *testing.T) (takeAtFunc, lister) {
			s := memstore.New(0)
			t.Cleanup(func() { s.Close() })
			return func(now time.Time, reqs []Request) ([]Decision, error) { return s.TakeAt(now, reqs), nil },
				func(zone string, p Policy, n int) []bucket.Use { return s.QuotaUsage(zone, p, t0, n) }
		},
	}
	for name, c := range map[string]func(t *testing.T) redis.UniversalClient{
		"redis": func(t *testing.T) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
		},
		"cluster": func(t *testing.T) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})
		},
	} {
		stores[name] = func(t *testing.T) (takeAtFunc, lister) {
			s := newRedisStore(t, c(t))
			return redisTakeAt(s), func(zone string, p Policy, n int) []bucket.Use {
				uses, truncated, err := s.QuotaUsage(context.Background(), zone, p, t0, n)
				if err != nil || truncated {
					t.Fatalf("QuotaUsage: %v, truncated %v", err, truncated)
				}
				return uses
			}
		}
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			take, list := newStore(t)
			for i := range 30 {
				if _, err := take(t0, []Request{{Zone: "q", Key: fmt.Sprint("key-", i), Policy: p, Cost: int64(i + 1)}}); err != nil {
					t.Fatal(err)
				}
			}
			uses := list("q", p, 3)
			if len(uses) != 3 || uses[0].Used != 30 || uses[1].Used != 29 || uses[2].Used != 28 {
				t.Fatalf("top 3: %+v", uses)
			}
			other := p
			other.Calendar.Loc, _ = bucket.LoadLocation("Pacific/Kiritimati") // +14: another day at t0
			if uses := list("q", other, 3); len(uses) != 0 {
				t.Fatalf("another period's: %+v", uses)
			}
		})
	}
}
