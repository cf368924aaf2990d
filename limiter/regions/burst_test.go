package regions_test

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// exactAdmits replays times (from the first) through one token bucket of
// p's whole burst and rate: what the exact limit admits of them.
func exactAdmits(p limiter.Policy, times []time.Duration) int {
	interval := float64(p.Period) / float64(p.Rate)
	tat, n := 0.0, 0 // the bucket's TAT, ns from the first request
	for _, at := range times {
		t := float64(at)
		next := max(tat, t) + interval
		if next-t <= float64(p.Burst)*interval {
			tat, n = next, n+1
		}
	}
	return n
}

// send sends key through r's limiter every tick for d (all at once when
// tick is 0, n of them), and returns the times sent (from start) and what
// was admitted.
func send(r *region, key string, p limiter.Policy, start time.Time, tick, d time.Duration, n int) ([]time.Duration, int) {
	var times []time.Duration
	admitted := 0
	for i := 0; tick == 0 && i < n || tick > 0 && time.Since(start) < d; i++ {
		times = append(times, time.Since(start))
		var v limiter.Verdict
		r.l.Decide(context.Background(), time.Time{}, []limiter.Request{{Zone: "api", Key: key, Policy: p, Cost: 1, Global: true}}, limiter.Caller{Events: quietEvents{}}, &v)
		if v.States[0] == limiter.Allowed {
			admitted++
		}
		v.Release()
		if tick > 0 {
			time.Sleep(tick)
		}
	}
	return times, admitted
}

// TestRegionsOneRegionBurst: a client that uses one region alone gets the
// zone's whole burst there, as the exact limit gives it, not the region's
// share: paced at three times the rate, it gets what the exact limit
// admits of the same requests, less what the first D (interval and
// timeout) at the share may hold back; a client known to the region, come
// back after its bucket refilled, gets its whole burst at once.
func TestRegionsOneRegionBurst(t *testing.T) {
	const interval = 200 * time.Millisecond
	w := newWorld(t, 20*time.Millisecond, interval)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 10, Period: time.Second, Burst: 60}
	time.Sleep(3 * interval)
	eu := w.regions[0]
	start := time.Now()
	times, admitted := send(eu, "paced", p, start, 33*time.Millisecond, 6*time.Second, 0)
	exact := exactAdmits(p, times)
	t.Logf("paced at 30/s in eu for 6 s: admitted %d of %d; the exact limit %d", admitted, len(times), exact)
	if admitted < exact-2 || float64(admitted) > float64(exact)+regions.Bound(p, 3, interval, time.Second) {
		t.Errorf("admitted %d; want the exact %d (less 2 at most)", admitted, exact)
	}
	fast := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 30, Period: time.Second, Burst: 60}
	send(eu, "back", fast, time.Now(), 0, 0, 1)
	time.Sleep(2500 * time.Millisecond) // refilled, and known for more than D
	if _, n := send(eu, "back", fast, time.Now(), 0, 0, 60); n != 60 {
		t.Errorf("a burst of 60 after the bucket refilled: %d admitted; want the whole burst, 60", n)
	}
}

// TestRegionsMovingClient: a client paced at twice the rate moves from eu
// to us. The regions stay within the bound of the exact limit of the same
// requests, and us admits again within D of the move, at least a quarter
// of the rate in every second after, though eu held the whole burst.
func TestRegionsMovingClient(t *testing.T) {
	const interval = 200 * time.Millisecond
	w := newWorld(t, 20*time.Millisecond, interval)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 10, Period: time.Second, Burst: 60}
	time.Sleep(3 * interval)
	start := time.Now()
	before, inEU := send(w.regions[0], "moving", p, start, 50*time.Millisecond, 4*time.Second, 0)
	var counts [4]int
	var after []time.Duration
	for s := range counts {
		times, n := send(w.regions[1], "moving", p, start, 50*time.Millisecond, time.Duration(5+s)*time.Second, 0)
		after, counts[s] = append(after, times...), n
	}
	exact := exactAdmits(p, append(before, after...))
	bound := regions.Bound(p, 3, interval, time.Second)
	t.Logf("eu admitted %d; then us, by second: %v; the exact limit %d of %d, bound %.0f", inEU, counts, exact, len(before)+len(after), bound)
	if total := inEU + counts[0] + counts[1] + counts[2] + counts[3]; float64(total) > float64(exact)+bound {
		t.Errorf("%d admitted; want at most the exact %d and the bound %.0f", total, exact, bound)
	}
	for s, n := range counts[2:] {
		if n < 3 {
			t.Errorf("us admitted %d in second %d after the move; want a quarter of the rate at least", n, s+2)
		}
	}
}
