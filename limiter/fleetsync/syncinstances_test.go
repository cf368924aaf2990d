package fleetsync_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// TestSyncFloorInRounds: an instance alone, with on_store_error local's
// instances at 3, takes a third of what its bucket holds at a round, not
// all of it: the floor holds at the rounds' readings as at the first.
func TestSyncFloorInRounds(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	fleet := syncFleet(t, limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}}, 1)
	registerAll(fleet, 100*time.Millisecond)
	l := fleet[0]
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 90, Period: time.Hour, Burst: 90}
	req := limiter.Request{Zone: "floor", Key: "k", Policy: p, Cost: 1, Sync: 100 * time.Millisecond}.WithDigest(nil)
	caller := limiter.Caller{Fallback: limiter.Fallback{Mode: limiter.FallbackLocal, Instances: 3}}
	var v limiter.Verdict
	admitted := 0
	for range 200 { // the first reads Redis; its share of 89 is 29
		l.Decide(context.Background(), time.Time{}, []limiter.Request{req}, caller, &v)
		if v.States[0] == limiter.Allowed {
			admitted++
		}
		v.Release()
	}
	time.Sleep(500 * time.Millisecond) // the refused bucket's round: it charges and reads
	_, granted, ok := l.SyncShare(req)
	if !ok {
		t.Fatal("no entry for the bucket")
	}
	if most := (90-int64(admitted))/3 + 1; granted > most {
		t.Fatalf("after %d admitted, a round granted %d of the %d left: more than a third (%d)", admitted, granted, 90-admitted, most)
	}
}

// TestSyncCountAfterEmptyRedis: three instances counting each other; their
// Redis restarts empty (every registration lost): none counts fewer than
// three while they register again.
func TestSyncCountAfterEmptyRedis(t *testing.T) {
	srv := redistest.NewServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	prefix := fmt.Sprintf("count%x:", rand.Uint64())
	fleet := syncFleet(t, limiter.RedisOptions{Addresses: []string{srv.Addr}, KeyPrefix: prefix}, 3)
	registerAll(fleet, 100*time.Millisecond)
	srv.Kill()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for i, l := range fleet {
			if n := l.Instances(); n < 3 {
				t.Fatalf("instance %d counts %d instances after its Redis restarted empty, want 3", i, n)
			}
		}
	}
	if n := c.ZCard(context.Background(), prefix+"{sync}:instances").Val(); n != 3 {
		t.Fatalf("%d instances registered again after the restart, want 3", n)
	}
}

// TestSyncRegistrationFailureReported: an instance whose registration
// fails (a Redis without ZADD) tells it as a failed round, though it has
// no bucket to charge: it decides every request in Redis, and says so.
func TestSyncRegistrationFailureReported(t *testing.T) {
	srv := redistest.NewServer(t, "--rename-command", "ZADD", "")
	rounds := &syncRounds{}
	fleet := syncFleet(t, limiter.RedisOptions{Addresses: []string{srv.Addr}}, 1, rounds)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 10, Period: time.Second, Burst: 10}
	req := limiter.Request{Zone: "noreg", Key: "k", Policy: p, Cost: 1, Sync: 100 * time.Millisecond}.WithDigest(nil)
	var v limiter.Verdict
	fleet[0].Decide(context.Background(), time.Time{}, []limiter.Request{req}, limiter.Caller{Fallback: limiter.Fallback{Mode: limiter.FallbackDeny}}, &v)
	v.Release()
	for end := time.Now().Add(5 * time.Second); rounds.failed.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("a registration that fails is not told as a failed round")
		}
	}
	if fleet[0].SyncReady() {
		t.Fatal("an instance that cannot register hands out shares")
	}
}

// TestSyncShareShrinksAsFleetGrows: an instance alone holds the whole
// bucket as its allowance; when two more instances register, it holds a
// third of it from its next registration, not from the bucket's next
// round.
func TestSyncShareShrinksAsFleetGrows(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	prefix := fmt.Sprintf("grow%x:", rand.Uint64())
	fleet := syncFleet(t, limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: prefix}, 1)
	registerAll(fleet, time.Second)
	l := fleet[0]
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 91, Period: time.Hour, Burst: 91}
	req := limiter.Request{Zone: "grow", Key: "k", Policy: p, Cost: 1, Sync: time.Second}.WithDigest(nil)
	var v limiter.Verdict
	l.Decide(context.Background(), time.Time{}, []limiter.Request{req}, limiter.Caller{Fallback: limiter.Fallback{Mode: limiter.FallbackDeny}}, &v)
	v.Release()
	allowance := func() int64 {
		if allowance, _, ok := l.SyncShare(req); ok {
			return allowance
		}
		return -1
	}
	a0 := allowance()
	if a0 < 85 {
		t.Fatalf("alone, the instance holds %d of the 90 left, want (nearly) all", a0)
	}
	now := c.Time(context.Background()).Val()
	for _, id := range []string{"other1", "other2"} {
		c.ZAdd(context.Background(), prefix+"{sync}:instances", redis.Z{Score: float64(now.UnixMilli()), Member: id})
	}
	for end := time.Now().Add(5 * time.Second); l.Instances() != 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the instance counts %d instances, want 3", l.Instances())
		}
	}
	if a := allowance(); a != a0/3 {
		t.Fatalf("with three instances, the instance holds %d, want a third of %d", a, a0)
	}
}
