package redisstore

import (
	"context"
	"fmt"
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

// TestRegionalRecent: a region that does not hold the burst counts as
// its own recent admissions those of the last D, in quarters of D (so at
// most D/4 more): 1.3 D after its admissions, which the peers have been
// charged since, it takes its share of the room they left, not its share
// less what it admitted; within D it still counts them.
func TestRegionalRecent(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Hour, Burst: 10} // the share: 30 in all
	const tag = "G3:1000000"                                                                 // D = 1 s
	admitted := func(key string, at time.Duration, times int) (n int) {
		t.Helper()
		for range times {
			d, err := s.TakeAt(context.Background(), t0.Add(at), []bucket.Request{{Zone: "recent", Key: key, Policy: p, Cost: 1, Global: true, ID: tag}})
			if err != nil {
				t.Fatal(err)
			}
			if d[0].Allowed {
				n++
			}
		}
		return n
	}
	peer := func(key string, at time.Duration, cost int64) {
		t.Helper()
		r := bucket.Request{Zone: "recent", Key: key, Policy: p, Cost: cost, Global: true, ID: "n:b:1"}
		if _, err := s.ChargeAt(context.Background(), t0.Add(at), []bucket.Request{r}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		key   string
		after time.Duration
		want  int
	}{
		{"within D", 900 * time.Millisecond, 0},            // the 9 still count: (18 + 9) / 3 − 9 = 0
		{"D and a quarter on", 1300 * time.Millisecond, 6}, // told: (30 − 12) / 3
	} {
		peer(c.key, 0, 3)                                           // a peer asks: no hold
		if n := admitted(c.key, 100*time.Millisecond, 12); n != 9 { // (30 − 3) / 3
			t.Fatalf("%s: %d admitted at first; want 9, the share of the room", c.key, n)
		}
		if n := admitted(c.key, 100*time.Millisecond+c.after, 12); n != c.want {
			t.Errorf("%s: %d admitted %s after the 9; want %d", c.key, n, c.after, c.want)
		}
	}
}

// TestRegionalRecentOld: a region's own record as written with two
// windows of D (the window and the one before) counts its admissions as
// recent until D after that window's end.
func TestRegionalRecentOld(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	s := newRedisStore(t, c)
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Hour, Burst: 10}
	r := bucket.Request{Zone: "recent", Key: "old", Policy: p, Cost: 1, Global: true, ID: "G3:1000000"}
	at := t0.Add(100 * time.Millisecond).UnixMicro()
	empty := t0.Add(100*time.Millisecond + 2*time.Hour).UnixMicro() // 12 of 30 spent: the TAT 12 h on, less the share's 10
	c.Set(context.Background(), s.key(r), fmt.Sprintf("%d000|L:0:%d:%d:%d:%d:9:0", empty, at, at, t0.UnixMicro(), at/1000000), time.Hour)
	d, err := s.TakeAt(context.Background(), t0.Add(time.Second+900*time.Millisecond), []bucket.Request{r})
	if err != nil {
		t.Fatal(err)
	}
	if d[0].Allowed {
		t.Errorf("%+v; want refused: the 9 of the old record's window still count, D after its end", d[0])
	}
}

// TestRegionalBothResume: two regions of a global token bucket (R = 2,
// D = 2 s, burst 30: 15 a region) that each served a client in the
// morning, and were charged each other's admissions then, both met the
// hold's rule by noon (each first asked hours ago, no peer charged for
// 2D). When the client comes back through both at once, each would spend
// the whole burst unseen by the other: 60 for a burst of 30, beyond the
// bound (R − 1) × ⌈burst / R⌉ + 2 × rate × D. A region that asks again
// after more than D without asking starts anew, as a quota's does.
func TestRegionalBothResume(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Hour, Burst: 15} // the share
	const tag = "G2:2000000"
	a, b := newRedisStore(t, c), newRedisStore(t, c)
	take := func(s *Store, at time.Duration) bool {
		t.Helper()
		r := bucket.Request{Zone: "resume", Key: "both", Policy: p, Cost: 1, Global: true, ID: tag}
		d, err := s.TakeAt(context.Background(), t0.Add(at), []bucket.Request{r})
		if err != nil {
			t.Fatal(err)
		}
		return d[0].Allowed
	}
	charge := func(s *Store, id string, at time.Duration) {
		t.Helper()
		r := bucket.Request{Zone: "resume", Key: "both", Policy: p, Cost: 1, Global: true, ID: id}
		if _, err := s.ChargeAt(context.Background(), t0.Add(at), []bucket.Request{r}); err != nil {
			t.Fatal(err)
		}
	}
	take(a, -3*time.Hour)
	take(b, -3*time.Hour)
	charge(a, "n:b:1", -3*time.Hour+time.Second)
	charge(b, "n:a:1", -3*time.Hour+time.Second)
	admitted := 0
	for range 30 { // noon: the client comes back through both at once, its bucket full again
		for _, s := range []*Store{a, b} {
			if take(s, 0) {
				admitted++
			}
		}
	}
	if bound := 30 + 15 + 1; admitted > bound { // the exact 30, (R − 1) × 15, 2 × rate × D under 1
		t.Errorf("admitted %d at noon through both regions; want at most %d", admitted, bound)
	}
}
