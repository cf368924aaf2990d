package regions_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// A quota run sends many clients' requests of a global quota through the
// regions of a world, each client's in a shape of its own (one region,
// even over the three, skewed, moving from one region to another), as
// Poisson processes, and compares what each client was admitted with the
// exact quota's replay of its arrivals: the first quota of them, the run
// being within one day.

// quotaShape is the rate (requests a second) of a client's requests in
// region i at a time into the run.
type quotaShape func(i int, at time.Duration) float64

// quotaClient is one client's tally: sent and admitted.
type quotaClient struct {
	key             string
	sent, admitted  atomic.Int64
	shape           quotaShape
	sentIn, gotIn   [3]atomic.Int64
	refusedRetryMax atomic.Int64 // the longest Retry-After of a refusal while the exact quota had room, in ms
}

// quotaRun sends every client through the regions of w for d, calling
// each event at its time.
func quotaRun(w *world, p limiter.Policy, clients []*quotaClient, d time.Duration, events map[time.Duration]func()) {
	var wg sync.WaitGroup
	start := time.Now()
	for at, ev := range events {
		t := time.AfterFunc(at, ev)
		defer t.Stop()
	}
	for _, c := range clients {
		for i, r := range w.regions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for at := time.Since(start); at < d; at = time.Since(start) {
					rate := c.shape(i, at)
					if rate <= 0 {
						time.Sleep(20 * time.Millisecond)
						continue
					}
					gap := time.Duration(rand.ExpFloat64() / rate * float64(time.Second))
					if at+gap >= d { // the next arrival is past the run
						return
					}
					time.Sleep(gap)
					quotaShot(r, p, c, i)
				}
			}()
		}
	}
	wg.Wait()
}

// quotaShot sends one request of c through r (region i).
func quotaShot(r *region, p limiter.Policy, c *quotaClient, i int) {
	var v limiter.Verdict
	r.l.Decide(context.Background(), time.Time{}, []limiter.Request{{Zone: "quota", Key: c.key, Policy: p, Cost: 1, Global: true}},
		limiter.Caller{Events: quietEvents{}}, &v)
	sent := c.sent.Add(1)
	c.sentIn[i].Add(1)
	if v.States[0] == limiter.Allowed {
		c.admitted.Add(1)
		c.gotIn[i].Add(1)
	} else if sent <= p.Rate && v.Decisions != nil { // the exact quota had room
		if ms := v.Decisions[0].RetryAfter.Milliseconds(); ms > c.refusedRetryMax.Load() {
			c.refusedRetryMax.Store(ms)
		}
	}
	v.Release()
}

// quotaTally is a run's sums against the exact replay.
type quotaTally struct {
	sent, admitted, exact, over, under, worstOver int64
}

func tally(p limiter.Policy, clients []*quotaClient) quotaTally {
	var q quotaTally
	for _, c := range clients {
		sent, got := c.sent.Load(), c.admitted.Load()
		exact := min(sent, p.Rate)
		q.sent, q.admitted, q.exact = q.sent+sent, q.admitted+got, q.exact+exact
		q.over += max(got-exact, 0)
		q.under += max(exact-got, 0)
		q.worstOver = max(q.worstOver, got-exact)
	}
	return q
}

// quotaClients are n clients of each shape, their keys named after it.
func quotaClients(run string, n int, shapes map[string]quotaShape) []*quotaClient {
	var out []*quotaClient
	for name, s := range shapes {
		for j := range n {
			out = append(out, &quotaClient{key: fmt.Sprintf("%s/%s/%d", run, name, j), shape: s})
		}
	}
	return out
}

// TestRegionsQuota: a global quota of 12 a day among three regions (20
// ms each way, sync 200ms, timeout 300ms), 240 clients over every
// master's slots, each sending twice its quota in 5 s in one of four
// shapes: one region, even over the three, skewed 80/10/10, moving from
// one region to another. Against the exact quota's replay of each
// client's arrivals: no client admitted more than the bound beyond it,
// and at most 3 % of what the exact quota admits refused (a region that
// does not hold the quota admits, within D of a peer's, its share of
// what the others left: the clients whose requests come through several
// regions at once). Then the same with ap cut off for 2 s, and with eu's
// Redis stopped for 2 s.
func TestRegionsQuota(t *testing.T) {
	if start, end := (bucket.Calendar{Unit: bucket.Day}).Bounds(time.Now()); time.Until(end) < time.Minute || time.Since(start) < time.Second {
		t.Skip("too near midnight UTC: the runs must be within one day")
	}
	const interval, timeout = 200 * time.Millisecond, 300 * time.Millisecond
	w := newWorldTimeout(t, 20*time.Millisecond, interval, timeout)
	eu := w.regions[0]
	eu.config.Redis.Timeout = 100 * time.Millisecond // so that its Redis stopped is soon seen
	eu.l = eu.instance(t)
	p := limiter.Policy{Algorithm: limiter.Quota, Rate: 12, Burst: 12, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	time.Sleep(3 * (interval + timeout))
	const d = 5 * time.Second
	rate := 2 * float64(p.Rate) / d.Seconds()
	shapes := map[string]quotaShape{
		"one":    func(i int, _ time.Duration) float64 { return map[bool]float64{true: rate}[i == 0] },
		"even":   func(int, time.Duration) float64 { return rate / 3 },
		"skewed": func(i int, _ time.Duration) float64 { return rate * [3]float64{0.1, 0.1, 0.8}[i] },
		"moving": func(i int, at time.Duration) float64 { return map[bool]float64{true: rate}[i == min(int(at/(d/2)), 1)] },
	}
	bound, began := regions.Bound(p, 3, interval, timeout), time.Now()
	for _, run := range []struct {
		name   string
		events map[time.Duration]func()
		extra  float64 // beyond the bound: a cut's (see TestRegionsAccuracy)
		under  float64
	}{
		{"linked", nil, 0, 0.03},
		{"ap cut off 2 s", map[time.Duration]func(){time.Second: func() { w.cut(t, "ap", true) }, 3 * time.Second: func() { w.cut(t, "ap", false) }},
			float64(regions.ShareOf(p.Rate, 3)), 0.25},
		{"eu's Redis stopped 2 s", map[time.Duration]func(){time.Second: eu.server.Pause, 3 * time.Second: eu.server.Resume},
			float64(regions.ShareOf(p.Rate, 3)), 0.25},
	} {
		clients := quotaClients(run.name, 60, shapes)
		quotaRun(w, p, clients, d, run.events)
		q := tally(p, clients)
		t.Logf("%s (%s): %d sent, %d admitted, the exact quota %d; over it %d (worst client %d, bound %.0f), refused within it %d (%.1f%%)",
			run.name, time.Since(began).Round(time.Second), q.sent, q.admitted, q.exact, q.over, q.worstOver, bound+run.extra, q.under, 100*float64(q.under)/float64(q.exact))
		if float64(q.worstOver) > bound+run.extra {
			t.Errorf("%s: a client admitted %d beyond the exact quota; want at most %.0f", run.name, q.worstOver, bound+run.extra)
		}
		if float64(q.under) > run.under*float64(q.exact) {
			t.Errorf("%s: %d refused that the exact quota admits; want at most %.0f%% of %d", run.name, q.under, 100*run.under, q.exact)
		}
		time.Sleep(regions.LinkTimeout(interval, timeout))
	}
}
