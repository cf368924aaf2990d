package overrides

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// putRestorable sets, through a, a zone's override until deleted, a key's
// override, and one that expires in 300 ms, and waits until b has them.
func putRestorable(t *testing.T, a, b *Overrides) [16]byte {
	t.Helper()
	ctx := context.Background()
	key := bucket.KeyHash("premium")
	for _, w := range []struct {
		zone   string
		digest *[16]byte
		o      Override
	}{
		{"api", nil, Override{Rate: "4r/m"}},
		{"api", &key, Override{Rate: "100r/m", Burst: 100}},
		{"soon", nil, Override{Rate: "1r/s", Expires: time.Now().Add(300 * time.Millisecond).UnixMilli()}},
	} {
		if err := a.Put(ctx, w.zone, w.digest, w.o); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "the overrides at b", func() bool { _, ok := b.Current().Key("api", key); return ok })
	return key
}

// checkRestored waits until each of the instances, and Redis, hold the
// overrides put by putRestorable but the expired one, and checks that one
// restore alone was written, of the 2 overrides still in force, beyond
// version held (the last before the loss).
func checkRestored(t *testing.T, c redis.UniversalClient, hash string, key [16]byte, held int64, recs []*overrideRecorder, insts ...*Overrides) {
	t.Helper()
	for i, o := range insts {
		waitFor(t, 10*time.Second, fmt.Sprintf("the overrides in force at instance %d", i), func() bool {
			z, zok := o.Current().Zone("api")
			k, kok := o.Current().Key("api", key)
			return zok && kok && z.Rate == "4r/m" && k.Burst == 100
		})
	}
	waitFor(t, 5*time.Second, "the overrides back in Redis", func() bool {
		n, err := c.HLen(context.Background(), hash).Result()
		return err == nil && n == 2
	})
	restores, whys := restoresOf(t, held, recs, insts)
	if len(restores) != 1 || restores[0] != 2 {
		t.Fatalf("restores written: %v (%q), want one, of 2 overrides", restores, whys)
	}
}

// TestRedisOverridesSurviveEmptyRestart: a standalone Redis killed and
// restarted empty: the instances write back the overrides they hold (one
// of them does), and an instance started afterwards reads them at start.
func TestRedisOverridesSurviveEmptyRestart(t *testing.T) {
	srv := redistest.NewServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer c.Close()
	prefix := fmt.Sprintf("rst%x:", rand.Uint64())
	recs := []*overrideRecorder{{}, {}}
	a, b := NewRedis(c, prefix, 0, recs[0]), NewRedis(c, prefix, 0, recs[1])
	for _, o := range []*Overrides{a, b} {
		o.SetPoll(time.Hour) // the subscription made again brings the read
		if err := o.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer o.Close()
	}
	key := putRestorable(t, a, b)
	time.Sleep(400 * time.Millisecond) // "soon" expired
	held := a.Current().Version()
	srv.Kill()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	checkRestored(t, c, prefix+"{overrides}", key, held, recs, a, b)
	late := NewRedis(c, prefix, 0, &overrideRecorder{})
	if err := late.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if _, ok := late.Current().Key("api", key); !ok {
		t.Fatal("an instance started after the restore does not have the key's override")
	}
	if _, ok := late.Current().Zone("soon"); ok {
		t.Fatal("the expired override was written back")
	}
}

// TestRedisOverridesSurviveMasterRestart: the Cluster master that holds the
// overrides' slot killed and restarted empty (no replica to take over).
func TestRedisOverridesSurviveMasterRestart(t *testing.T) {
	cl := redistest.NewClusterOf(t, 3, 0)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer c.Close()
	prefix := fmt.Sprintf("rstc%x:", rand.Uint64())
	recs := []*overrideRecorder{{}, {}}
	a, b := NewRedis(c, prefix, 0, recs[0]), NewRedis(c, prefix, 0, recs[1])
	for _, o := range []*Overrides{a, b} {
		o.SetPoll(time.Hour) // the subscription made again, and the retries of failed reads, bring the read
		if err := o.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer o.Close()
	}
	key := putRestorable(t, a, b)
	held := a.Current().Version()
	ctx := context.Background()
	master, err := c.MasterForKey(ctx, prefix+"{overrides}")
	if err != nil {
		t.Fatal(err)
	}
	srv := cl.Server(master.Options().Addr)
	srv.Kill()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	checkRestored(t, c, prefix+"{overrides}", key, held, recs, a, b)
}

// TestRedisOverridesLostWriteRestored: Redis goes back to an earlier
// version of the overrides (a failover to a replica that lacked the last
// write, a restore from a backup): an instance that holds the later
// version writes it back, and the next change builds on it.
func TestRedisOverridesLostWriteRestored(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	a, b, recB := redisOverridesPair(t, c)
	src := a.src.(*redisOverrides)
	ctx := context.Background()
	if err := a.Put(ctx, "x", nil, Override{Rate: "1r/s"}); err != nil {
		t.Fatal(err)
	}
	saved := map[string]string{}
	for _, k := range []string{src.hash, src.versionKey} {
		saved[k] = c.Dump(ctx, k).Val()
	}
	if err := a.Put(ctx, "lost", nil, Override{Disabled: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the change at b", func() bool { _, ok := b.Current().Zone("lost"); return ok })
	held := b.Current().Version()
	for k, v := range saved { // Redis as it was before the change: the change is lost
		c.RestoreReplace(ctx, k, 0, v)
	}
	waitFor(t, 5*time.Second, "the lost change back in Redis", func() bool { return c.HExists(ctx, src.hash, "zone:lost").Val() })
	if v := tokenVersion(c.Get(ctx, src.versionKey).Val()); v <= held {
		t.Fatalf("version %d after the restore, want beyond the %d held", v, held)
	}
	if err := a.Put(ctx, "y", nil, Override{Rate: "2r/s"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "b on every change", func() bool {
		cur := b.Current()
		_, lost := cur.Zone("lost")
		_, y := cur.Zone("y")
		return y && lost
	})
	restores, whys := restoresOf(t, held, []*overrideRecorder{recB, a.ev.(*overrideRecorder)}, []*Overrides{a, b})
	if len(restores) != 1 || restores[0] != 1 {
		t.Fatalf("restores written: %v (%q), want one, of the 1 override lost", restores, whys)
	}
}

// TestRedisOverridesDivergedMerged: a Redis whose version has the number
// held but another nonce (a change made after a lost one, before any
// instance noticed) is merged with what the instances hold: its later
// changes (an override added, one deleted by a tombstone) stand, and
// nothing is written back.
func TestRedisOverridesDivergedMerged(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	a, b, recB := redisOverridesPair(t, c)
	src := a.src.(*redisOverrides)
	ctx := context.Background()
	if err := a.Put(ctx, "x", nil, Override{Rate: "1r/s"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the change at b", func() bool { _, ok := b.Current().Zone("x"); return ok })
	v := b.Current().Version()
	x, _ := b.Current().Zone("x")
	c.HSet(ctx, src.hash, "zone:y", `{"rate":"2r/s"}`)
	c.HSet(ctx, src.hash, "zone:x", fmt.Sprintf(`{"deleted":true,"expires":%d,"stamp":{"ms":%d,"n":0}}`,
		time.Now().Add(time.Hour).UnixMilli(), x.Stamp.MS+1))
	c.Set(ctx, src.versionKey, fmt.Sprintf("%d:other", v), 0)
	waitFor(t, 3*time.Second, "b on what Redis holds", func() bool {
		_, x := b.Current().Zone("x")
		_, y := b.Current().Zone("y")
		return y && !x
	})
	if r, _ := recB.restores(); len(r) != 0 {
		t.Fatalf("restores written: %v, want none", r)
	}
}

// TestRedisOverridesOwnPushReadFirst: the push of a change made here is
// read before the write's reply is applied (as on a loaded machine). The
// change is then in force already: the version it moved from, below the
// one held, is no loss, and nothing is written back (a restore would move
// the version on with a push that names no entries, and make the other
// instances wait for a whole read).
func TestRedisOverridesOwnPushReadFirst(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	ctx := context.Background()
	rec := &overrideRecorder{}
	o := NewRedis(c, fmt.Sprintf("own%x:", rand.Uint64()), 0, rec)
	o.SetPoll(time.Hour) // the push alone brings the change
	if err := o.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	src := o.src.(*redisOverrides)
	waitFor(t, 10*time.Second, "the subscription", func() bool {
		n, err := c.PubSubNumSub(ctx, src.channel).Result()
		return err == nil && n[src.channel] > 0
	})
	_, d, err := src.write(ctx, "api", nil, Override{Rate: "2r/h"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the change's push read", func() bool { return o.Current().tokenOf() == d.next })
	o.applyOwn(ctx, d) // the write's reply, after its push
	if v, err := src.version(ctx); err != nil || v != d.next {
		t.Fatalf("the version in Redis after the change: %q (%v), want the change's %q", v, err, d.next)
	}
	if restores, whys := rec.restores(); len(restores) != 0 {
		t.Fatalf("restores written: %v (%q), want none", restores, whys)
	}
	if z, ok := o.Current().Zone("api"); !ok || z.Rate != "2r/h" || o.Current().tokenOf() != d.next {
		t.Fatalf("in force: %+v %v at %q, want the change at %q", z, ok, o.Current().tokenOf(), d.next)
	}
}
