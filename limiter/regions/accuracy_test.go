package regions_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// An accuracy run sends one client's requests through the regions of a
// world, each region's a Poisson process of a rate that may change over
// the run, and compares what the regions admitted with an exact replay of
// the same arrivals through one token bucket of the zone's whole burst and
// rate: at most the bound more, not much less, and no region with
// requests starved (see check).

// shot is a request of an accuracy run.
type shot struct {
	at       time.Duration // from the run's start
	region   int
	admitted bool
}

// demand is the rate (requests a second) of region i's requests at a
// time into the run, and whether its zone is global then.
type demand func(i int, at time.Duration) (rate float64, global bool)

// poissonRun sends key through the regions of w as want says for d,
// calling each event at its time, and returns the global zone's shots in
// the order they were sent.
func poissonRun(w *world, key string, p limiter.Policy, d time.Duration, want demand, events map[time.Duration]func()) []shot {
	var mu sync.Mutex
	var shots []shot
	var wg sync.WaitGroup
	start := time.Now()
	for at, ev := range events {
		t := time.AfterFunc(at, ev)
		defer t.Stop()
	}
	for i, r := range w.regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for at := time.Since(start); at < d; at = time.Since(start) {
				rate, global := want(i, at)
				if rate <= 0 {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				time.Sleep(time.Duration(rand.ExpFloat64() / rate * float64(time.Second)))
				var v limiter.Verdict
				r.l.Decide(context.Background(), time.Time{}, []limiter.Request{{Zone: "api", Key: key, Policy: p, Cost: 1, Global: global}}, limiter.Caller{Events: quietEvents{}}, &v)
				if global {
					mu.Lock()
					shots = append(shots, shot{at: time.Since(start), region: i, admitted: v.States[0] == limiter.Allowed})
					mu.Unlock()
				}
				v.Release()
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(shots, func(a, b shot) int { return int(a.at - b.at) })
	return shots
}

// accuracy is what check holds a run to: the bound beyond the exact
// replay, the share of the exact admissions that may be missing, the
// window of the starvation check, and the windows it skips.
type accuracy struct {
	bound  float64
	under  float64
	window time.Duration
	skip   func(from time.Duration) bool
}

// check checks shots against the exact replay: at most a.bound more
// admitted, at least (1 - a.under) of it; and in every window not
// skipped, each region that sent requests admitted at least a quarter of
// its even share (the rate over the regions that sent, or what it sent,
// if less).
func check(t *testing.T, name string, p limiter.Policy, shots []shot, a accuracy) {
	t.Helper()
	times, admitted := make([]time.Duration, len(shots)), 0
	for i, s := range shots {
		times[i] = s.at
		if s.admitted {
			admitted++
		}
	}
	exact := exactAdmits(p, times)
	t.Logf("%s: %d admitted of %d; the exact replay %d, bound %.0f", name, admitted, len(shots), exact, a.bound)
	if float64(admitted) > float64(exact)+a.bound {
		t.Errorf("%s: %d admitted; want at most the exact %d plus the bound %.0f", name, admitted, exact, a.bound)
	}
	if float64(admitted) < (1-a.under)*float64(exact) {
		t.Errorf("%s: %d admitted; want at least %.0f%% of the exact %d", name, admitted, 100*(1-a.under), exact)
	}
	checkStarving(t, name, p, shots, a)
}

// checkStarving is check's starvation check.
func checkStarving(t *testing.T, name string, p limiter.Policy, shots []shot, a accuracy) {
	t.Helper()
	rate := float64(p.Rate) / p.Period.Seconds()
	for from := time.Duration(0); len(shots) > 0 && from+a.window <= shots[len(shots)-1].at; from += a.window {
		if a.skip != nil && a.skip(from) {
			continue
		}
		sent, got := map[int]int{}, map[int]int{}
		for _, s := range shots {
			if s.at >= from && s.at < from+a.window {
				sent[s.region]++
				if s.admitted {
					got[s.region]++
				}
			}
		}
		for i, n := range sent {
			even := min(float64(n), rate*a.window.Seconds()/float64(len(sent)))
			if float64(got[i]) < even/4 {
				t.Errorf("%s: region %d admitted %d of %d in [%s, %s); want a quarter of its even share (%.0f) at least",
					name, i, got[i], n, from, from+a.window, even)
			}
		}
	}
}

// TestRegionsAccuracy: one client of a global zone (50r/s, burst 20)
// through three regions (20 ms each way, sync 200ms, timeout 300ms: D
// 0.5 s), in the shapes real traffic takes: one region only, skewed 90/10,
// even, moving from one region to another, one region cut off and
// healed, one region's Redis stopped and resumed, global rolled out
// region by region. Each run is checked against the exact replay of its
// arrivals (see check).
func TestRegionsAccuracy(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 300 * time.Millisecond
	w := newWorldTimeout(t, 20*time.Millisecond, interval, timeout)
	eu := w.regions[0]
	eu.config.Redis.Timeout = 100 * time.Millisecond // so that its Redis stopped is soon seen
	eu.l = eu.instance(t)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 50, Period: time.Second, Burst: 20}
	time.Sleep(3 * (interval + timeout))
	bound := regions.Bound(p, 3, interval, timeout)
	link := regions.LinkTimeout(interval, timeout)
	cutExtra := 7 + 50*(link+interval).Seconds() // ⌈burst/R⌉ + rate × (LinkTimeout + interval)
	const window = 5 * interval
	steady := func(rates ...float64) demand {
		return func(i int, _ time.Duration) (float64, bool) { return rates[i], true }
	}
	for _, c := range []struct {
		name  string
		want  demand
		under float64
	}{ // within the limit (80 % of it), then twice over it
		{"one region, within", steady(40, 0, 0), 0.01},
		{"even, within", steady(13, 13, 14), 0.01},
		{"one region, over", steady(100, 0, 0), 0.02},
		{"skewed 90/10, over", steady(90, 10, 0), 0.06}, // a region's own recent admissions within 2D × rate / (R − 1): see the package doc
		{"even, over", steady(35, 35, 35), 0.1},
	} {
		shots := poissonRun(w, c.name, p, 5*time.Second, c.want, nil)
		check(t, c.name, p, shots, accuracy{bound: bound, under: c.under, window: window})
	}
	moving := func(i int, at time.Duration) (float64, bool) {
		return map[bool]float64{true: 100}[i == min(int(at/(3*time.Second)), 1)], true
	}
	check(t, "moving eu to us", p, poissonRun(w, "moving", p, 6*time.Second, moving, nil), accuracy{bound: bound, under: 0.15, window: window,
		skip: func(from time.Duration) bool {
			return from >= 3*time.Second && from < 3*time.Second+3*(interval+timeout)
		}})
	testAccuracyFailures(t, w, p, accuracy{bound: bound + cutExtra, under: 0.15, window: window}, link)
}

// testAccuracyFailures is TestRegionsAccuracy's runs with a failure:
// ap cut off, eu's Redis stopped, a zone made global region by region.
// The windows within LinkTimeout and a window of a change are not checked
// for starvation.
func testAccuracyFailures(t *testing.T, w *world, p limiter.Policy, a accuracy, link time.Duration) {
	even := func(int, time.Duration) (float64, bool) { return 35, true }
	eu := w.regions[0]
	t.Cleanup(eu.server.Resume)
	t.Cleanup(func() { w.cut(t, "ap", false) })
	around := func(changes ...time.Duration) func(time.Duration) bool {
		return func(from time.Duration) bool {
			for _, c := range changes {
				if from+a.window > c && from < c+link+a.window {
					return true
				}
			}
			return false
		}
	}
	a.skip = around(2*time.Second, 5*time.Second)
	cut := map[time.Duration]func(){2 * time.Second: func() { w.cut(t, "ap", true) }, 5 * time.Second: func() { w.cut(t, "ap", false) }}
	check(t, "ap cut off 3 s", p, poissonRun(w, "partition", p, 8*time.Second, even, cut), a)
	time.Sleep(link)
	stop := map[time.Duration]func(){2 * time.Second: eu.server.Pause, 4 * time.Second: eu.server.Resume}
	a.skip = around(2*time.Second, 4*time.Second, 5*time.Second) // eu, its Redis back, takes the most for a second or two
	check(t, "eu's Redis stopped 2 s", p, poissonRun(w, "stopped", p, 7*time.Second, even, stop), a)
	rollout := func(i int, at time.Duration) (float64, bool) { return 35, i == 0 || at >= 2*time.Second }
	a.skip = func(from time.Duration) bool { return from < 2*time.Second+a.window }
	check(t, "global rolled out after eu", p, poissonRun(w, "rollout", p, 6*time.Second, rollout, nil), a)
}
