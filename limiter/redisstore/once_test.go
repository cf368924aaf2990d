package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestChargeOnce: a charge whose id is "n:<sender>:<epoch>:<life>" (a
// region's exchange, see limiter/regions; "o:..." sent again) charges its
// total once per sender and epoch: sent again, it charges nothing; a larger total
// charges only what it adds; a late copy (a lower total, an earlier
// epoch) nothing; a new epoch its whole total; another sender its own.
// Alone (keys declared) and in a batch of a cluster node (keys in several
// slots, none declared).
func TestChargeOnce(t *testing.T) {
	standalone := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer standalone.Close()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})
	defer cluster.Close()
	for name, c := range map[string]redis.UniversalClient{"standalone": standalone, "cluster": cluster} {
		t.Run(name, func(t *testing.T) { testChargeOnce(t, newRedisStore(t, c)) })
	}
}

func testChargeOnce(t *testing.T, s *Store) {
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Hour, Burst: 1000}
	keys := make([]bucket.Request, 40) // over every master's slots
	for i := range keys {
		keys[i] = bucket.Request{Zone: "once", Key: fmt.Sprint("k", i), Policy: p, Global: true}
	}
	steps := []struct {
		what   string
		id     string // "take": a take of cost total, this region's own request
		total  int64
		remain int64
	}{
		{"first send", "n:a:5", 3, 997},
		{"sent again", "o:a:5", 3, 997},
		{"more in the epoch", "o:a:5", 7, 993},
		{"a take of this region's", "take", 1, 992},
		{"a late copy", "o:a:5", 4, 992},
		{"an earlier epoch", "o:a:4", 9, 992},
		{"a new epoch", "n:a:6", 2, 990},
		{"sent again", "o:a:6", 2, 990},
		{"another sender", "n:b:1", 5, 985},
		{"its send again", "o:b:1", 5, 985},
		{"a plain charge", "", 1, 984},
		{"the first sender again", "o:a:6", 2, 984},
	}
	for _, step := range steps {
		for _, batch := range [][]bucket.Request{keys[:1], keys[1:]} {
			reqs := make([]bucket.Request, len(batch))
			for i, r := range batch {
				r.ID, r.Cost = step.id, step.total
				reqs[i] = r
			}
			charge := s.ChargeAt
			if step.id == "take" {
				charge = s.TakeAt
				for i := range reqs {
					reqs[i].ID = ""
				}
			}
			got, err := charge(context.Background(), t0, reqs)
			if err != nil {
				t.Fatalf("%s: %v", step.what, err)
			}
			for i, d := range got {
				if d.Remaining != step.remain {
					t.Fatalf("%s (%d keys), key %d: remaining %d, want %d", step.what, len(batch), i, d.Remaining, step.remain)
				}
			}
		}
	}
	testChargeOnceRecords(t, s, keys[0])
	fresh := slices.Clone(keys)
	for i := range fresh {
		fresh[i].Zone = "level"
	}
	testChargeLevel(t, s, fresh)
}

// testChargeLevel: a charge sent once that ends in ":<level>" (the time
// its sender's copy of the bucket was empty, in µs from now) lifts the
// bucket to it when it holds more, whatever its cost (0: a level alone),
// and leaves a bucket spent further alone; a missing bucket is made.
func testChargeLevel(t *testing.T, s *Store, keys []bucket.Request) {
	interval := time.Hour.Microseconds() // of Rate 1, Period an hour
	level := func(spent int64) string { return fmt.Sprint(-(1000 - spent) * interval) }
	steps := []struct {
		what   string
		id     string
		cost   int64
		remain int64
	}{
		{"a level alone, on no bucket", "n:c:1:" + level(50), 0, 950},
		{"a lower level", "n:c:2:" + level(20), 0, 950},
		{"a charge and a lower level", "n:c:3:" + level(40), 5, 945},
		{"a higher level with a charge", "n:c:4:" + level(100), 1, 900},
		{"sent again: the level holds", "o:c:4:" + level(100), 1, 900},
		{"a level in debt", "n:c:5:" + level(1500), 0, 0},
	}
	for _, step := range steps {
		for _, batch := range [][]bucket.Request{keys[:1], keys[1:]} {
			reqs := make([]bucket.Request, len(batch))
			for i, r := range batch {
				r.ID, r.Cost = step.id, step.cost
				reqs[i] = r
			}
			got, err := s.ChargeAll(context.Background(), reqs) // now: the levels are from now
			if err != nil {
				t.Fatalf("%s: %v", step.what, err)
			}
			for i, d := range got {
				if d.Remaining != step.remain {
					t.Fatalf("%s (%d keys), key %d: remaining %d, want %d", step.what, len(batch), i, d.Remaining, step.remain)
				}
			}
		}
	}
}

// testChargeOnceRecords: a bucket keeps the records of its 8 latest
// senders, in its own value.
func testChargeOnceRecords(t *testing.T, s *Store, r bucket.Request) {
	for i := range 9 {
		r.ID, r.Cost = fmt.Sprintf("n:s%d:1", i), 1
		if _, err := s.ChargeAt(context.Background(), t0, []bucket.Request{r}); err != nil {
			t.Fatal(err)
		}
	}
	v, _, _ := strings.Cut(s.client.Get(context.Background(), s.key(r)).Val(), "|L:") // the region's own record apart
	if !strings.Contains(v, "|s8:1:1") || strings.Contains(v, "|s0:") || strings.Count(v, "|") != 8 {
		t.Errorf("value %q; want the records of the 8 latest senders, s1 to s8", v)
	}
	r.ID = "o:s0:1" // its record gone: charged again
	d, err := s.ChargeAt(context.Background(), t0, []bucket.Request{r})
	if err != nil || d[0].Remaining != 984-9-1 {
		t.Errorf("a send again of a sender whose record is gone: %+v, %v; want charged", d, err)
	}
}
