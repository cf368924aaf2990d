package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// takeAtFunc is a store's TakeAt, with the time given.
type takeAtFunc func(now time.Time, reqs []Request) ([]Decision, error)

// testStores make a fresh store of each kind for a test.
var testStores = map[string]func(t *testing.T) takeAtFunc{
	"memory": func(t *testing.T) takeAtFunc {
		s := memstore.New(time.Hour)
		t.Cleanup(func() { s.Close() })
		return func(now time.Time, reqs []Request) ([]Decision, error) { return s.TakeAt(now, reqs), nil }
	},
	"redis": func(t *testing.T) takeAtFunc {
		return redisTakeAt(newRedisStore(t, redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})))
	},
	"cluster": func(t *testing.T) takeAtFunc {
		return redisTakeAt(newRedisStore(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})))
	},
}

// newRedisStore makes a store with a prefix of its own, so that tests
// sharing a Redis do not see each other's keys.
func newRedisStore(t testing.TB, c redis.UniversalClient) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, fmt.Sprintf("test:%x:", rand.Uint64()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func redisTakeAt(s *redisstore.Store) takeAtFunc {
	return func(now time.Time, reqs []Request) ([]Decision, error) {
		return s.TakeAt(context.Background(), now, reqs)
	}
}
