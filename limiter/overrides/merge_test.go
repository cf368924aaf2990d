package overrides

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// region is one region of the tests: its Redis, an instance on it with a
// clock of its own, and a Writer to it, as the other regions copy to it.
type region struct {
	c     *redis.Client
	o     *Overrides
	w     *Writer
	clock atomic.Int64 // Unix ns
}

func newRegion(t *testing.T, addr, prefix string, at time.Time) *region {
	t.Helper()
	r := &region{c: redis.NewClient(&redis.Options{Addr: addr})}
	t.Cleanup(func() { r.c.Close() })
	r.clock.Store(at.UnixNano())
	r.o = NewRedis(r.c, prefix, 0, &overrideRecorder{})
	r.o.now = func() time.Time { return time.Unix(0, r.clock.Load()) }
	r.o.SetPoll(200 * time.Millisecond)
	if err := r.o.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.o.Close)
	r.w = NewRedisWriter(r.c, prefix, 0)
	return r
}

// kindOf is what r's instance enforces for key in zone "api".
func (r *region) kindOf(key [16]byte) string {
	o, ok := r.o.Current().Key("api", key)
	if !ok {
		return "none"
	}
	return o.Kind()
}

// TestRedisOverridesPartitionHealsToLater: two regions, each with its
// Redis, cut from each other: a block of a key set in one, an exemption
// of it set in the other a second later (in both orders), and the copies
// made both ways once the link is back (in both orders of arrival): both
// regions enforce the later change.
func TestRedisOverridesPartitionHealsToLater(t *testing.T) {
	srv := redistest.NewServer(t)
	key := bucket.KeyHash("v")
	at := time.Now()
	for i, tc := range []struct{ first, later Override }{
		{Override{Block: true}, Override{Exempt: true}},
		{Override{Exempt: true}, Override{Block: true}},
	} {
		for _, copyLaterFirst := range []bool{false, true} {
			prefix := fmt.Sprintf("part%x:", rand.Uint64())
			euAddr, usAddr := redistest.StandaloneAddr(t), srv.Addr
			if i == 1 { // the later change in the other region
				euAddr, usAddr = usAddr, euAddr
			}
			eu := newRegion(t, euAddr, prefix, at)
			us := newRegion(t, usAddr, prefix, at.Add(time.Second))
			ctx := context.Background()
			first, err := eu.o.PutStamped(ctx, "api", &key, tc.first)
			if err != nil {
				t.Fatal(err)
			}
			later, err := us.o.PutStamped(ctx, "api", &key, tc.later)
			if err != nil {
				t.Fatal(err)
			}
			copies := []func() error{
				func() error { return us.w.Put(ctx, "api", &key, first) },
				func() error { return eu.w.Put(ctx, "api", &key, later) },
			}
			if copyLaterFirst {
				copies[0], copies[1] = copies[1], copies[0]
			}
			for _, c := range copies {
				if err := c(); err != nil {
					t.Fatal(err)
				}
			}
			want := tc.later.Kind()
			waitFor(t, 5*time.Second, fmt.Sprintf("case %d, later copied first %v: %s in both regions", i, copyLaterFirst, want), func() bool {
				return eu.kindOf(key) == want && us.kindOf(key) == want
			})
		}
	}
}

// TestRedisOverridesSkewedClockLaterWins: the instance of a region whose
// clock is 5 s behind changes an override after it read a change made
// elsewhere: its change is the later (its stamp comes after the one it
// read, whatever its clock says), and both regions keep it, whatever the
// order the copies arrive in, the earlier one copied again included.
func TestRedisOverridesSkewedClockLaterWins(t *testing.T) {
	srv := redistest.NewServer(t)
	key := bucket.KeyHash("skewed")
	prefix := fmt.Sprintf("skew%x:", rand.Uint64())
	now := time.Now()
	eu := newRegion(t, redistest.StandaloneAddr(t), prefix, now)
	us := newRegion(t, srv.Addr, prefix, now.Add(-5*time.Second))
	ctx := context.Background()
	block, err := eu.o.PutStamped(ctx, "api", &key, Override{Block: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := us.w.Put(ctx, "api", &key, block); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the block read in us", func() bool { return us.kindOf(key) == "block" })
	exempt, err := us.o.PutStamped(ctx, "api", &key, Override{Exempt: true})
	if err != nil {
		t.Fatal(err)
	}
	if exempt.Stamp.Compare(block.Stamp) <= 0 {
		t.Fatalf("the later change's stamp %+v is not after the one read, %+v", exempt.Stamp, block.Stamp)
	}
	if err := eu.w.Put(ctx, "api", &key, exempt); err != nil {
		t.Fatal(err)
	}
	if err := us.w.Put(ctx, "api", &key, block); err != nil { // the earlier one, copied again
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the exemption in both regions", func() bool {
		return eu.kindOf(key) == "exempt" && us.kindOf(key) == "exempt"
	})
}
