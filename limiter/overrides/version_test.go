package overrides

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// TestRedisOverridesVersionStaysInteger: a version at 1e14 and beyond
// (Lua's numbers are doubles, which tostring prints as 1e+14) is written
// as an integer by a change and by a restore, and read as one.
func TestRedisOverridesVersionStaysInteger(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	ctx := context.Background()
	o := NewRedis(c, fmt.Sprintf("ver%x:", rand.Uint64()), 0, &overrideRecorder{})
	src := o.src.(*redisOverrides)
	c.Set(ctx, src.versionKey, "99999999999999:x", 0)
	if err := o.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if err := o.Put(ctx, "api", nil, Override{Rate: "1r/s"}); err != nil {
		t.Fatal(err)
	}
	v := c.Get(ctx, src.versionKey).Val()
	if tokenVersion(v) != 100000000000000 || v[:15] != "100000000000000" {
		t.Fatalf("version after a change: %q (read as %d), want 100000000000000:<nonce>", v, tokenVersion(v))
	}
	c.Set(ctx, src.versionKey, "99999999999998:y", 0) // went back: a restore
	n, _, token, err := src.merge(ctx, 99999999999999, []entryChange{{zone: "b", o: Override{Rate: "1r/s", Stamp: Stamp{MS: 1}}}})
	if err != nil || n != 1 {
		t.Fatalf("restore: %d written, %v", n, err)
	}
	if tokenVersion(token) != 100000000000000 || token[:15] != "100000000000000" {
		t.Fatalf("version after a restore: %q, want 100000000000000:<nonce>", token)
	}
}
