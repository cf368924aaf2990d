package redisstore

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestQuotaUsageUntrusted: the keys a usage listing reads are what anyone
// who can write Redis wrote: a key of the zone's name holding a hash (a
// WRONGTYPE reply), a count of no shape and a megabyte of digits are
// left out, and the listing gives the counts of the others, not an error.
func TestQuotaUsageUntrusted(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 100, Burst: 100, Period: bucket.Month.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Month}}
	ctx := context.Background()
	for i, key := range []string{"a", "b", "c"} {
		if _, err := s.TakeAt(ctx, t0, []bucket.Request{{Zone: "q", Key: key, Policy: p, Cost: int64(i + 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	key := func(k string) string { return s.key(bucket.Request{Zone: "q", Key: k, Policy: p}) }
	c.HSet(ctx, key("hash"), "f", "v")
	c.Set(ctx, key("shapeless"), "x:y", 0)
	c.Set(ctx, key("huge"), strings.Repeat("9", 1<<20), 0)
	uses, truncated, err := s.QuotaUsage(ctx, "q", p, t0, 10)
	if err != nil || truncated || len(uses) != 3 || uses[0].Used != 3 || uses[2].Used != 1 {
		t.Fatalf("usage beside untrusted keys: %+v, truncated %v, %v", uses, truncated, err)
	}
}

// TestTopUsesOnce: SCAN may return a key more than once; a listing names
// each digest once.
func TestTopUsesOnce(t *testing.T) {
	uses := bucket.TopUses([]bucket.Use{{Digest: "a", Used: 3}, {Digest: "b", Used: 2}, {Digest: "a", Used: 3}}, 2)
	if len(uses) != 2 || uses[0].Digest != "a" || uses[1].Digest != "b" {
		t.Fatalf("top 2 of a, b, a: %+v", uses)
	}
}

// TestQuotaUsageGlobal: a global quota's key keeps, after its count and
// start, what its region admitted and its records ("<count>:<start>:
// <own>|…", quota.lua); the usage listing gives its count all the same.
func TestQuotaUsageGlobal(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	ctx := context.Background()
	for _, tag := range []string{"G3:2000000", "G3:2000000", ""} {
		if _, err := s.TakeAt(ctx, t0, []bucket.Request{{Zone: "gq", Key: "a", Policy: quotaNine, Cost: 1, Global: true, ID: tag}}); err != nil {
			t.Fatal(err)
		}
	}
	uses, _, err := s.QuotaUsage(ctx, "gq", quotaNine, t0, 10)
	if err != nil || len(uses) != 1 || uses[0].Used != 3 {
		t.Fatalf("usage of a global quota's client: %+v, %v; want its count, 3", uses, err)
	}
}
