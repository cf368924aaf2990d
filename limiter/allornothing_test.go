package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// TestFailedRunGivesBack: a request whose zones live on two masters is
// all or nothing: when one master fails (out of memory), the zone the
// other master charged is given back, so that on_store_error decides a
// request that nothing counted.
func TestFailedRunGivesBack(t *testing.T) {
	cl := redistest.NewClusterOf(t, 3, 0)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	s := newRedisStore(t, c)
	p := Policy{Algorithm: TokenBucket, Rate: 5, Period: time.Hour, Burst: 5}
	ctx := context.Background()
	healthy := Request{Zone: "healthy", Key: "client", Policy: p, Cost: 1}
	var failing Request
	for i := 0; ; i++ {
		failing = Request{Zone: "failing", Key: fmt.Sprint("other-", i), Policy: p, Cost: 1}
		if s.Node(ctx, failing) != s.Node(ctx, healthy) {
			break
		}
	}
	node := redis.NewClient(&redis.Options{Addr: s.Node(ctx, failing)})
	defer node.Close()
	if err := node.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := s.Take(tctx, []Request{healthy, failing})
		cancel()
		if err == nil {
			t.Fatal("a take on an out-of-memory master succeeded")
		}
	}
	if err := node.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	d, err := s.Peek(ctx, healthy)
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != 5 {
		t.Fatalf("after 3 requests that failed on another master: %d of 5 left in the healthy zone; want 5 (given back)", d.Remaining)
	}
}

func TestAllOrNothing(t *testing.T) {
	for name, newStore := range testStores {
		// One key: both zones in one hash slot (one script run). Two keys:
		// two slots in a cluster, so a refused request is refunded.
		for _, tightKey := range []string{"k", "other"} {
			t.Run(name+"/"+tightKey, func(t *testing.T) { testAllOrNothing(t, newStore(t), tightKey) })
		}
	}
}

func testAllOrNothing(t *testing.T, take takeAtFunc, tightKey string) {
	loose := Request{Zone: "loose", Key: "k", Policy: Policy{Rate: 100, Period: time.Minute, Burst: 100}, Cost: 1}
	tight := Request{Zone: "tight", Key: tightKey, Policy: Policy{Rate: 2, Period: time.Minute, Burst: 2}, Cost: 1}
	for i := range 5 {
		d, err := take(t0, []Request{loose, tight})
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 2; d[0].Allowed != true || d[1].Allowed != want {
			t.Fatalf("request %d: loose %v tight %v; want true %v", i, d[0].Allowed, d[1].Allowed, want)
		}
	}
	// Three refusals by the tight zone took nothing from the loose one.
	if d, err := take(t0, []Request{loose}); err != nil || d[0].Remaining != 97 {
		t.Fatalf("loose zone remaining %d (%v); want 97", d[0].Remaining, err)
	}
}
