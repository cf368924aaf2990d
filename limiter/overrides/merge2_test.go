package overrides

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/latencyproxy"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// cuttable is an instance whose link to its Redis can be cut.
type cuttable struct {
	o *Overrides
	p *latencyproxy.Proxy
}

// cuttables starts n instances on the Redis at addr, each through a link
// of its own, under one prefix.
func cuttables(t *testing.T, addr, prefix string, n int) []cuttable {
	t.Helper()
	var out []cuttable
	for range n {
		p, err := latencyproxy.Start(addr, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		o := NewRedis(c, prefix, 0, &overrideRecorder{})
		o.SetPoll(200 * time.Millisecond)
		if err := o.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(o.Close)
		out = append(out, cuttable{o, p})
	}
	return out
}

// TestRedisOverridesCopyToEmptyRedisKept: a region's Redis restarts
// empty, and a change copied from another region lands on it before the
// region's instances read again: the instances write back what they hold
// around it, and the copied change stays, in Redis and in force.
func TestRedisOverridesCopyToEmptyRedisKept(t *testing.T) {
	srv := redistest.NewServer(t)
	prefix := fmt.Sprintf("cpy%x:", rand.Uint64())
	us := cuttables(t, srv.Addr, prefix, 2)
	ctx := context.Background()
	if err := us[0].o.Put(ctx, "api", nil, Override{Rate: "4r/m"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the zone's override at both", func() bool { _, ok := us[1].o.Current().Zone("api"); return ok })
	for _, u := range us {
		u.p.Refuse()
	}
	srv.Kill()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	key := bucket.KeyHash("v")
	block := stampedAt(Override{Block: true}, time.Now().UnixMilli(), "e0")
	if err := NewRedisWriter(c, prefix, 0).Put(ctx, "api", &key, block); err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if err := u.p.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	both := func() bool {
		for _, u := range us {
			k, kok := u.o.Current().Key("api", key)
			_, zok := u.o.Current().Zone("api")
			if !kok || !k.Block || !zok {
				return false
			}
		}
		return c.HExists(ctx, prefix+"{overrides}", "zone:api").Val() &&
			c.HExists(ctx, prefix+"{overrides}", overrideField("api", &key)).Val()
	}
	waitFor(t, 10*time.Second, "the copied block and the zone's override, in Redis and at both", both)
	time.Sleep(time.Second) // a few polls
	if !both() {
		t.Fatal("the copied block or the zone's override went again")
	}
}

// TestRedisOverridesDeletedStaysDeleted: instances A and B on one Redis,
// B cut from it; an exemption deleted through A; A cut in turn; Redis
// restarted empty; B back first, writing back its older state (the
// exemption); A back: the deletion, the later change, stands at both.
func TestRedisOverridesDeletedStaysDeleted(t *testing.T) {
	srv := redistest.NewServer(t)
	prefix := fmt.Sprintf("del%x:", rand.Uint64())
	in := cuttables(t, srv.Addr, prefix, 2)
	a, b := in[0], in[1]
	ctx := context.Background()
	key := bucket.KeyHash("v")
	if err := a.o.Put(ctx, "api", &key, Override{Exempt: true}); err != nil {
		t.Fatal(err)
	}
	exempt := func(x cuttable) bool { _, ok := x.o.Current().Key("api", key); return ok }
	waitFor(t, 5*time.Second, "the exemption at b", func() bool { return exempt(b) })
	b.p.Refuse()
	if found, err := a.o.Delete(ctx, "api", &key); err != nil || !found {
		t.Fatalf("delete: %v %v", found, err)
	}
	a.p.Refuse()
	srv.Kill()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	if err := b.p.Heal(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "b's older state written back", func() bool {
		return c.HExists(ctx, prefix+"{overrides}", overrideField("api", &key)).Val()
	})
	if err := a.p.Heal(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the exemption deleted at both", func() bool { return !exempt(a) && !exempt(b) })
	time.Sleep(time.Second) // a few polls
	if exempt(a) || exempt(b) {
		t.Fatalf("the exemption came back: at a %v, at b %v", exempt(a), exempt(b))
	}
}
