package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestSyncWindowCarries: a window's count charged past its limit by a
// zone that syncs carries what went over into the next window, at most
// a limit, and no further: a limit of 10 charged 25 in one window leaves
// 0 in the next, and all of it in the one after (the sliding counter's
// previous count of 10 weighing on). An exact zone whose limit fell (an
// override that ended) carries nothing.
func TestSyncWindowCarries(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, algo := range []bucket.Algorithm{bucket.FixedWindow, bucket.SlidingWindowCounter} {
		p := bucket.Policy{Algorithm: algo, Rate: 10, Period: time.Second, Burst: 10}
		r := bucket.Request{Zone: "carry", Key: "k", Policy: p, Cost: 25, Sync: time.Second}
		d := make([]bucket.Decision, 1)
		at := func(d time.Duration) string { return strconv.FormatInt(t0.Add(d).UnixMicro(), 10) }
		if err := s.settle(context.Background(), at(100*time.Millisecond), modeCharge, []bucket.Request{r}, []int{0}, nil, d); err != nil {
			t.Fatal(err)
		}
		if d[0].Remaining != -15 {
			t.Fatalf("%s: charged 25 on a limit of 10: remaining %d, want -15", algo, d[0].Remaining)
		}
		r.Cost = 0 // readings, near each window's start: the keys expire in real time
		steps := []struct {
			at   time.Duration
			want int64
		}{{1001 * time.Millisecond, 0}, {2001 * time.Millisecond, 10}}
		if algo == bucket.SlidingWindowCounter { // the previous count of 10 weighs 0.999
			steps[1].want = 0
		}
		for _, step := range steps {
			if got := readingAt(t, s, t0.Add(step.at), r); got != step.want {
				t.Fatalf("%s at %s: remaining %d, want %d", algo, step.at, got, step.want)
			}
		}
		exact := bucket.Request{Zone: "carry-exact", Key: "k", Policy: bucket.Policy{Algorithm: algo, Rate: 20, Period: time.Second, Burst: 20}, Cost: 15}
		readingAt(t, s, t0.Add(100*time.Millisecond), exact)
		exact.Policy.Rate, exact.Policy.Burst, exact.Cost = 10, 10, 0 // the limit fell
		if got := readingAt(t, s, t0.Add(1001*time.Millisecond), exact); algo == bucket.FixedWindow && got != 10 {
			t.Fatalf("%s: an exact zone whose limit fell from 20 to 10 after a count of 15: remaining %d in the next window, want 10", algo, got)
		}
	}
}
