package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestQuotaClockOffByPeriods: a gateway whose clock is more than a
// period off Redis's sends periods that do not hold Redis's time. The
// call fails (its zone's on_store_error decides), and the count that
// gateways with a right clock keep is not touched: before, the script
// counted in the nearest of the periods it was given, so the skewed
// gateway and the others each found the other's period in the key and
// started the count afresh, and a day's quota of 2 admitted 2 per turn.
func TestQuotaClockOffByPeriods(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 2, Burst: 2, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	req := []bucket.Request{{Zone: "q", Key: "k", Policy: p, Cost: 1}}
	take := func(skew time.Duration) (bucket.Decision, error) {
		wallClock = func() time.Time { return time.Now().Add(skew) }
		defer func() { wallClock = time.Now }()
		d, err := s.Take(context.Background(), req)
		if err != nil {
			return bucket.Decision{}, err
		}
		return d[0], nil
	}
	if start, end := p.Calendar.Bounds(time.Now()); time.Until(end) < 10*time.Second || time.Since(start) < 10*time.Second {
		t.Skip("too near midnight UTC")
	}
	for i := range 2 {
		if d, err := take(0); err != nil || !d.Allowed {
			t.Fatalf("take %d with the right clock: %+v, %v", i, d, err)
		}
	}
	for _, skew := range []time.Duration{49 * time.Hour, -49 * time.Hour} {
		if d, err := take(skew); err == nil {
			t.Errorf("a gateway %s off: %+v, no error", skew, d)
		}
	}
	if d, err := take(0); err != nil || d.Allowed || d.Used != 2 {
		t.Fatalf("the third with the right clock: %+v, %v; want refused, 2 used", d, err)
	}
	if d, err := take(3 * time.Second); err != nil || d.Allowed { // off by less than a period: Redis's clock decides
		t.Fatalf("a gateway 3s off: %+v, %v; want refused", d, err)
	}
}
