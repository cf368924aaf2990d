package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// A global quota among 3 regions whose charges reach each other within
// D = 2 s (see quota.lua): 9 a day, a region's share 3.
var (
	quotaNine = bucket.Policy{Algorithm: bucket.Quota, Rate: 9, Burst: 9, Period: bucket.Day.Nominal(),
		Calendar: bucket.Calendar{Unit: bucket.Day}}
	dayEnd = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC) // the end of t0's day
)

// quotaWorld takes and charges a global quota's keys in one region's Redis
// at times from t0.
type quotaWorld struct {
	t *testing.T
	s *Store
}

func (w quotaWorld) take(key, tag string, at time.Duration) bucket.Decision {
	w.t.Helper()
	r := bucket.Request{Zone: "gq", Key: key, Policy: quotaNine, Cost: 1, Global: true, ID: tag}
	d, err := w.s.TakeAt(context.Background(), t0.Add(at), []bucket.Request{r})
	if err != nil {
		w.t.Fatal(err)
	}
	return d[0]
}

// takes takes n times, and returns how many were admitted and the last
// decision.
func (w quotaWorld) takes(key, tag string, at time.Duration, n int) (int, bucket.Decision) {
	w.t.Helper()
	admitted, last := 0, bucket.Decision{}
	for range n {
		if last = w.take(key, tag, at); last.Allowed {
			admitted++
		}
	}
	return admitted, last
}

// charge charges key as a peer's exchange does: id "n:<sender>:<epoch>"
// (with a level), and the end of the period its admissions counted in.
func (w quotaWorld) charge(key, id string, cost int64, end time.Time, at time.Duration) {
	w.t.Helper()
	r := bucket.Request{Zone: "gq", Key: key, Policy: quotaNine, Cost: cost, Global: true,
		ID: fmt.Sprintf("%s@%d", id, end.UnixMicro())}
	now := strconv.FormatInt(t0.Add(at).UnixMicro(), 10) // as ChargeAll, at a time: a level's cost is 0
	if err := w.s.settle(context.Background(), now, modeCharge, []bucket.Request{r}, []int{0}, nil, make([]bucket.Decision, 1)); err != nil {
		w.t.Fatal(err)
	}
}

// TestRegionalQuota: a global quota's take with every region counted
// ("G3:<D>") admits, until it holds the whole quota, its share of what
// the others left, and, refused by its share while the quota has room,
// says to ask again within a quarter of D; once it first asked D ago and
// no peer charged for 2D, it holds the whole quota. A peer's charge counts
// once, in the period it names only, and lifts the count to its level.
func TestRegionalQuota(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	w := quotaWorld{t, newRedisStore(t, c)}
	const whole = "G3:2000000"
	if n, d := w.takes("holder", whole, 0, 4); n != 3 || d.Allowed || d.RetryAfter > 500*time.Millisecond || d.RetryAfter <= 0 {
		t.Errorf("the first D: %d admitted, then %+v; want the share, 3, then refused for at most D/4", n, d)
	}
	if n, d := w.takes("holder", whole, 2*time.Second, 7); n != 6 || d.Allowed || d.RetryAfter != dayEnd.Sub(t0.Add(2*time.Second)) || d.Used != 9 {
		t.Errorf("D later, no peer: %d admitted, then %+v; want the whole quota, 6 more, then refused until midnight, 9 used", n, d)
	}
	w.charge("charged", "n:b:1", 5, dayEnd, 0)
	if n, d := w.takes("charged", whole, time.Second, 3); n != 2 || d.Allowed {
		t.Errorf("a peer charged 5: %d admitted, then %+v; want ⌈(9 − 5) / 3⌉ = 2", n, d)
	}
	w.charge("charged", "o:b:1", 5, dayEnd, time.Second)                   // sent again: nothing
	w.charge("charged", "n:b:2", 1, dayEnd.Add(24*time.Hour), time.Second) // of the next day: nothing
	w.charge("charged", "n:b:3", 1, dayEnd.Add(-24*time.Hour), time.Second)
	if d := w.take("charged", "", 10*time.Second); !d.Allowed || d.Used != 8 {
		t.Errorf("after a charge sent again and two of other days: %+v; want 7 counted, the 8th admitted", d)
	}
	w.charge("level", "n:c:1:8", 0, dayEnd, 0)
	if d := w.take("level", whole, 5*time.Second); !d.Allowed || d.Used != 9 {
		t.Errorf("lifted to a peer's level of 8: %+v; want 9 used", d)
	}
	w.charge("level", "n:c:2:3", 0, dayEnd, 6*time.Second)
	if d := w.take("level", "", 7*time.Second); d.Allowed || d.Used != 9 {
		t.Errorf("a lower level: %+v; want the count kept, 9, refused", d)
	}
}

// TestRegionalQuotaAlone: alone ("A3:<D>"), a region admits its share of
// the quota in the period, what it admitted with every region counted
// included, and within the quota's count: refused by its share while the
// quota has room, it says to ask again in D. A new period starts whole,
// the region's recent admissions of the last one forgotten.
func TestRegionalQuotaAlone(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	w := quotaWorld{t, newRedisStore(t, c)}
	const whole, alone = "G3:2000000", "A3:2000000"
	if n, d := w.takes("cut", alone, 0, 4); n != 3 || d.Allowed || d.RetryAfter != 2*time.Second {
		t.Errorf("alone: %d admitted, then %+v; want the share, 3, then refused for D", n, d)
	}
	w.takes("then cut", whole, 0, 2)
	if n, _ := w.takes("then cut", alone, 3*time.Second, 3); n != 1 {
		t.Errorf("alone after 2 with every region: %d admitted; want 1 more, the share 3", n)
	}
	w.charge("spent", "n:b:1", 8, dayEnd, 0)
	if n, d := w.takes("spent", alone, time.Second, 2); n != 1 || d.RetryAfter != dayEnd.Sub(t0.Add(time.Second)) {
		t.Errorf("alone, 8 of 9 counted: %d admitted, then %+v; want 1, then refused until midnight", n, d)
	}
	last := dayEnd.Sub(t0) - time.Second // the day's last second: not holding yet at the turn
	w.takes("turn", whole, last, 3)
	if n, d := w.takes("turn", whole, last+1500*time.Millisecond, 4); n != 3 || d.Used != 3 {
		t.Errorf("the next day, within D: %d admitted, then %+v; want the share again, 3, counted from 0", n, d)
	}
}
