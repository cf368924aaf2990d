package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestRegionalTags: a global zone's take tagged "A3" (its region alone of
// 3, its policy the share's rate) decides on the region's own time, which
// the other regions' charges do not move, and leaves the world's time no
// emptier than its own; one tagged "G3" (the whole rate) decides on the
// world's time and moves the own time on at the share's rate, never into
// debt.
func TestRegionalTags(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	whole := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Hour, Burst: 10}
	alone := whole
	alone.Period = 3 * time.Hour
	n := 0
	req := func(p bucket.Policy, id string) bucket.Request {
		return bucket.Request{Zone: "regional", Key: "k" + string(rune('a'+n)), Policy: p, Cost: 1, Global: true, ID: id}
	}
	take := func(what string, r bucket.Request, times int, want int64) {
		t.Helper()
		for i := range times {
			d, err := s.TakeAt(context.Background(), t0, []bucket.Request{r})
			if err != nil {
				t.Fatal(err)
			}
			if i == times-1 && (d[0].Remaining != want || !d[0].Allowed && want >= 0) {
				t.Errorf("%s: take %d: %+v; want remaining %d", what, i+1, d[0], want)
			}
		}
	}
	charge := func(r bucket.Request, cost int64) {
		r.ID, r.Cost = "n:peer:1", cost
		if _, err := s.ChargeAt(context.Background(), t0, []bucket.Request{r}); err != nil {
			t.Fatal(err)
		}
	}
	// Alone: the peers' charges do not count; the world's time follows.
	charge(req(whole, ""), 10)
	take("alone, the world's bucket charged empty by a peer", req(alone, "A3:2000000"), 10, 0)
	if d, _ := s.TakeAt(context.Background(), t0, []bucket.Request{req(alone, "A3:2000000")}); d[0].Allowed || d[0].RetryAfter != 3*time.Hour {
		t.Errorf("alone, the share spent: %+v; want refused for one share's interval, 3h", d[0])
	}
	n++
	take("alone, the share", req(alone, "A3:2000000"), 10, 0)
	if d, _ := s.TakeAt(context.Background(), t0, []bucket.Request{req(whole, "G3:2000000")}); d[0].Allowed {
		t.Errorf("the world's bucket after the share was spent alone: %+v; want empty, as the own", d[0])
	}
	n++ // With the whole rate: the own time moves on, never into debt.
	take("whole rate, once", req(whole, "G3:2000000"), 1, 9)
	take("then alone", req(alone, "A3:2000000"), 1, 8)
	n++
	take("whole rate, twice the share", req(whole, "G3:2000000"), 10, 0)
	charge(req(whole, ""), -1) // nothing: a peer's charge of nothing
	if d, _ := s.TakeAt(context.Background(), t0.Add(3*time.Hour), []bucket.Request{req(alone, "A3:2000000")}); !d[0].Allowed || d[0].Remaining != 0 {
		t.Errorf("alone, one share's interval after the whole rate spent the share: %+v; want one token, no debt", d[0])
	}
}

// TestRegionalHold: with the whole rate ("G3:<D>"), a region holds the
// whole burst (3 shares) once it first asked for the key D ago and no
// peer charged it for 2D; a peer's charge ends the hold. A region that
// starts asking while a peer charges takes its share at once.
func TestRegionalHold(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Hour, Burst: 10} // the share
	const tag = "G3:2000000"                                                                 // D = 2 s
	at := func(key string, d time.Duration, times int) []bucket.Decision {
		t.Helper()
		var out []bucket.Decision
		for range times {
			got, err := s.TakeAt(context.Background(), t0.Add(d), []bucket.Request{{Zone: "hold", Key: key, Policy: p, Cost: 1, Global: true, ID: tag}})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, got[0])
		}
		return out
	}
	peer := func(key string, d time.Duration) {
		t.Helper()
		r := bucket.Request{Zone: "hold", Key: key, Policy: p, Cost: 1, Global: true, ID: "n:b:1"}
		if _, err := s.ChargeAt(context.Background(), t0.Add(d), []bucket.Request{r}); err != nil {
			t.Fatal(err)
		}
	}
	if d := at("holder", 0, 1)[0]; !d.Allowed || d.Remaining != 9 {
		t.Errorf("first request: %+v; want the share, 9 left", d)
	}
	if d := at("holder", 2*time.Second, 25); !d[24].Allowed || d[24].Remaining != 4 {
		t.Errorf("D later, no peer: %+v; want the whole burst, 30, 4 left", d[24])
	}
	peer("holder", 3*time.Second)
	if d := at("holder", 3500*time.Millisecond, 1)[0]; d.Allowed {
		t.Errorf("after a peer's charge: %+v; want the share, spent", d)
	}
	peer("newcomer", 0)
	if d := at("newcomer", time.Second, 1)[0]; !d.Allowed || d.Remaining != 8 {
		t.Errorf("a region that starts asking while a peer charges: %+v; want its share at once, 8 left", d)
	}
	if d := at("newcomer", 3*time.Second, 1)[0]; !d.Allowed || d.Remaining != 7 {
		t.Errorf("D after its first request, the peer's charge within 2D: %+v; want its share, 7 left", d)
	}
	if d := at("newcomer", 5*time.Second, 1)[0]; !d.Allowed || d.Remaining != 26 {
		t.Errorf("2D after the peer's last charge: %+v; want the whole burst, 26 left", d)
	}

}
