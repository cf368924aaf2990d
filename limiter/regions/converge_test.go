package regions_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// TestRegionsCopiesConverge: one region's copy of a bucket is spent 40
// tokens further than the others' (what a region was not told leaves
// copies apart: charges dropped in a partition, a rollout, debt; here put
// in its Redis by hand), and a client sends to each region at the zone's
// rate (three times the rate in all). Every copy is charged what every
// region admits, so the copies stay apart unless the regions tell each
// other their levels: the one spent further would admit nothing, for
// good. Within a second every region admits again, each at least a
// quarter of its even share in every window of five intervals, and the
// regions together stay within the bound.
func TestRegionsCopiesConverge(t *testing.T) {
	const interval = 200 * time.Millisecond
	w := newWorld(t, 20*time.Millisecond, interval)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 30}
	time.Sleep(3 * interval) // each region's mark reaches the others
	runPaced(w, "converge", p, 10*time.Millisecond, time.Second, true)
	spend(t, w, w.regions[1], "api", "converge", 40*10*time.Millisecond)
	const window, windows = 5 * interval, 6
	res := paceWindows(w, "converge", p, 10*time.Millisecond, window, windows*window)
	total := 0
	for name, counts := range res {
		t.Logf("%s admitted, by window of %s: %v", name, window, counts)
		for i, n := range counts {
			total += n
			if even := 100 * window.Seconds() / 3; i > 0 && i < windows && float64(n) < even/4 {
				t.Errorf("%s admitted %d in window %d; want a quarter of its even share (%.0f) at least", name, n, i, even)
			}
		}
	}
	exact := float64(p.Burst) + 100*(windows*window).Seconds()
	if bound := regions.Bound(p, 3, interval, time.Second); float64(total) > exact+bound {
		t.Errorf("%d admitted in all; want at most the exact %.0f plus the bound %.0f", total, exact, bound)
	}
}

// spend moves the time of r's copy of key's bucket in zone on by d (d ×
// rate tokens spent), in its Redis.
func spend(t *testing.T, w *world, r *region, zone, key string, d time.Duration) {
	t.Helper()
	c := r.client()
	defer c.Close()
	k := redisstore.RedisKey(w.prefix, zone, bucket.KeyHash(w.keyIn[r.name]+key)) + ":g"
	const script = `local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local at, rest = string.match(v, '^(%d+)(.*)$')
redis.call('SET', KEYS[1], string.format('%.0f', tonumber(at) + tonumber(ARGV[1])) .. rest,
  'PX', redis.call('PTTL', KEYS[1]) + tonumber(ARGV[2]))
return 1`
	n, err := c.Eval(context.Background(), script, []string{k}, d.Nanoseconds(), d.Milliseconds()).Int()
	if err != nil || n != 1 {
		t.Fatalf("spending %s of %s's copy: %d, %v", d, r.name, n, err)
	}
}

// paceWindows sends, through each region of w, one request of key every
// tick for d, and counts what each region admitted in each window.
func paceWindows(w *world, key string, p limiter.Policy, tick, window, d time.Duration) map[string][]int {
	res := map[string][]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for _, r := range w.regions {
		counts := make([]int, (d+window-1)/window)
		res[r.name] = counts
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(tick)
			defer t.Stop()
			for range t.C {
				at := time.Since(start)
				if at >= d {
					return
				}
				var v limiter.Verdict
				r.l.Decide(context.Background(), time.Time{}, []limiter.Request{{Zone: "api", Key: w.keyIn[r.name] + key, Policy: p, Cost: 1, Global: true}}, limiter.Caller{Events: quietEvents{}}, &v)
				if v.States[0] == limiter.Allowed {
					mu.Lock()
					counts[at/window]++
					mu.Unlock()
				}
				v.Release()
			}
		}()
	}
	wg.Wait()
	return res
}

// TestRegionsHomeDown: eu's Redis stops (SIGSTOP) for three seconds under
// a client sending to each region at the zone's rate; eu decides in
// memory (on_store_error local), unseen by the others but charging them.
// It admits at most its region's share (⌈burst/R⌉ + rate/R), not the
// whole rate, so that the others, charged what it admits, keep admitting
// while it is down (at least a quarter of their even share in every
// window of five intervals) and after; together within the bound and
// what eu's share may add.
func TestRegionsHomeDown(t *testing.T) {
	const interval = 200 * time.Millisecond
	w := newWorldTimeout(t, 20*time.Millisecond, interval, 300*time.Millisecond)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 30}
	eu := w.regions[0]
	eu.config.Redis.Timeout = 50 * time.Millisecond
	eu.l = eu.instance(t)
	time.Sleep(3 * interval)
	const window, windows = 5 * interval, 6
	eu.server.Pause()
	resumed := false
	defer func() {
		if !resumed {
			eu.server.Resume()
		}
	}()
	time.AfterFunc(3*window, func() { eu.server.Resume() })
	res := paceWindows(w, "home-down", p, 10*time.Millisecond, window, windows*window)
	resumed = true
	total, down := 0, 0
	for name, counts := range res {
		t.Logf("%s admitted, by window of %s (eu's Redis down in the first 3): %v", name, window, counts)
		for i, n := range counts {
			total += n
			if name == "eu" && i < 3 {
				down += n
			}
			if even := 100 * window.Seconds() / 3; name != "eu" && i > 0 && float64(n) < even/4 {
				t.Errorf("%s admitted %d in window %d; want a quarter of its even share (%.0f) at least", name, n, i, even)
			}
		}
	}
	if share := 10 + 100.0/3*(3*window+interval).Seconds(); float64(down) > share {
		t.Errorf("eu admitted %d with its Redis down for %s; want at most its share, %.0f", down, 3*window, share)
	}
	exact := float64(p.Burst) + 100*(windows*window).Seconds()
	if bound := regions.Bound(p, 3, interval, 300*time.Millisecond) + 10 + 100.0/3*interval.Seconds(); float64(total) > exact+bound {
		t.Errorf("%d admitted in all; want at most the exact %.0f plus %.0f", total, exact, bound)
	}
}
