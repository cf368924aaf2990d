package overrides

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// fillOverrides writes n zone overrides ("zone:z<i>") into hash, in
// pipelines of 1,000.
func fillOverrides(t *testing.T, c redis.UniversalClient, hash string, n int) {
	t.Helper()
	ctx := context.Background()
	for start := 0; start < n; start += 1000 {
		fields := make([]any, 0, 2000)
		for i := start; i < min(start+1000, n); i++ {
			fields = append(fields, fmt.Sprintf("zone:z%d", i), `{"rate":"1r/s"}`)
		}
		if err := c.HSet(ctx, hash, fields...).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedisOverridesEntriesCapped: anyone who can write the overrides'
// hash cannot make an instance hold more than MaxEntries of them:
// the rest is skipped, reported once, and the instance keeps serving with
// what it read.
func TestRedisOverridesEntriesCapped(t *testing.T) {
	srv := redistest.NewServer(t) // its own: the test fills it
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	prefix := fmt.Sprintf("cap%x:", rand.Uint64())
	fillOverrides(t, c, prefix+"{overrides}", MaxEntries+100)
	c.Set(context.Background(), prefix+"{overrides}:version", "1:x", 0)
	rec := &overrideRecorder{}
	o := NewRedis(c, prefix, 0, rec)
	if err := o.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if z, _ := o.Current().Count(time.Now()); z != MaxEntries {
		t.Fatalf("%d zone overrides in force, want at most %d", z, MaxEntries)
	}
	c.Set(context.Background(), prefix+"{overrides}:version", "2:y", 0)
	if err := o.Start(context.Background()); err != nil { // a reload: read again
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.overLimit) != 1 || rec.overLimit[0] != fmt.Sprintf("%d held, %d read", MaxEntries+100, MaxEntries) {
		t.Fatalf("reports of the entries left out: %q, want one", rec.overLimit)
	}
}

// TestRedisOverridesOversizedEntries: an entry whose name or value is
// longer than an override's can be is skipped, and reported once, with
// its name cut short; the others load.
func TestRedisOverridesOversizedEntries(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	prefix := fmt.Sprintf("big%x:", rand.Uint64())
	ctx := context.Background()
	long := "zone:" + strings.Repeat("n", 4000)
	huge := `{"rate":"1r/s","by":"` + strings.Repeat("v", 1<<20) + `"}`
	c.HSet(ctx, prefix+"{overrides}", long, `{"rate":"1r/s"}`, "zone:huge", huge, "zone:ok", `{"rate":"2r/s"}`)
	c.Set(ctx, prefix+"{overrides}:version", "1:x", 0)
	rec := &overrideRecorder{}
	o := NewRedis(c, prefix, 0, rec)
	if err := o.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if z, _ := o.Current().Count(time.Now()); z != 1 {
		t.Fatalf("%d zone overrides in force, want the one that fits", z)
	}
	c.Set(ctx, prefix+"{overrides}:version", "2:y", 0)
	if err := o.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, skipped, _, _ := rec.snapshot()
	if len(skipped) != 2 {
		t.Fatalf("skipped: %d reports, want one for each of the 2 oversized entries", len(skipped))
	}
	for _, s := range skipped {
		if len(s) > 400 {
			t.Errorf("a report of %d bytes: %.200s…", len(s), s)
		}
	}
}

// TestRedisOverridesWholeReadsSpaced: a flood of announcements that do not
// follow on from the version held (anyone who can publish on the channel
// can send them) costs at most about one whole read a second; a real
// change still arrives.
func TestRedisOverridesWholeReadsSpaced(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	a, b, _ := redisOverridesPair(t, c)
	src := b.src.(*redisOverrides)
	var whole atomic.Int32
	src.afterScan = func() { whole.Add(1) }
	time.Sleep(300 * time.Millisecond) // b subscribed
	ctx := context.Background()
	stop := time.Now().Add(3 * time.Second)
	for i := 0; time.Now().Before(stop); i++ {
		c.Set(ctx, src.versionKey, fmt.Sprintf("%d:bump", i), 0)
		c.Publish(ctx, src.channel, fmt.Sprintf("x %d:bump zone:api", i))
		time.Sleep(10 * time.Millisecond)
	}
	if n := whole.Load(); n > 6 {
		t.Fatalf("%d whole reads in 3s of version bumps, want about one a second", n)
	}
	if err := a.Put(ctx, "api", nil, Override{Rate: "5r/m"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the change at b", func() bool { o, _ := b.Current().Zone("api"); return o.Rate == "5r/m" })
}
