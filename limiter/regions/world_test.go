package regions_test

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// paced sends, through each region of w, one request of key every tick
// until stop is closed, and counts what each admitted and the slowest
// decision.
type pacedResult struct {
	admitted map[string]int
	sent     map[string]int
	slowest  time.Duration
	span     time.Duration
	failures int // decisions that were not the store's
}

func pace(w *world, key string, p limiter.Policy, tick time.Duration, global bool, stop <-chan struct{}) pacedResult {
	res := pacedResult{admitted: map[string]int{}, sent: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for _, r := range w.regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(tick)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
				}
				began := time.Now()
				p := p
				p.Rate = cmp.Or(w.rateIn[r.name], p.Rate)
				var v limiter.Verdict
				r.l.Decide(context.Background(), time.Time{}, []limiter.Request{{Zone: "api", Key: w.keyIn[r.name] + key, Policy: p, Cost: 1, Global: global}}, limiter.Caller{Events: quietEvents{}}, &v)
				took := time.Since(began)
				mu.Lock()
				res.sent[r.name]++
				if v.States[0] == limiter.Allowed {
					res.admitted[r.name]++
				}
				if v.Calls[0].Failure != limiter.NoFailure {
					res.failures++
				}
				res.slowest = max(res.slowest, took)
				mu.Unlock()
				v.Release()
			}
		}()
	}
	wg.Wait()
	res.span = time.Since(start)
	return res
}

func (p pacedResult) total() int {
	n := 0
	for _, a := range p.admitted {
		n += a
	}
	return n
}

// run paces key through w for d.
func runPaced(w *world, key string, p limiter.Policy, tick, d time.Duration, global bool) pacedResult {
	stop := make(chan struct{})
	time.AfterFunc(d, func() { close(stop) })
	return pace(w, key, p, tick, global, stop)
}

// TestRegionsBound: three regions, 80 ms each way between them, one
// client sending to each region at the zone's rate (three times the rate
// in all). A global zone admits, in all regions together, at most the
// exact limit over the run plus regions.Bound, and most of the limit;
// without global, each region grants the whole limit.
func TestRegionsBound(t *testing.T) {
	const interval = 200 * time.Millisecond
	w := newWorld(t, 80*time.Millisecond, interval)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 30}
	time.Sleep(3 * interval) // each region's mark reaches the others
	res := runPaced(w, "spread", p, 10*time.Millisecond, 5*time.Second, true)
	exact := float64(p.Burst) + 100*res.span.Seconds()
	bound := regions.Bound(p, 3, interval, time.Second)
	t.Logf("global: admitted %v = %d in %s; exact %.0f, stated bound %.0f more; slowest decision %s",
		res.admitted, res.total(), res.span.Round(time.Millisecond), exact, bound, res.slowest)
	if float64(res.total()) > exact+bound {
		t.Errorf("%d admitted in all regions; want at most the exact %.0f plus the bound %.0f", res.total(), exact, bound)
	}
	if float64(res.total()) < 0.7*exact {
		t.Errorf("%d admitted in all regions (%v sent); want most of the exact %.0f", res.total(), res.sent, exact)
	}
	for _, r := range w.regions {
		r.ev.mu.Lock()
		t.Logf("%s: exchanges %v (ok, failed), link changes %v, first failures %v", r.name, r.ev.exchanges, r.ev.changes, r.ev.failures)
		if len(r.ev.changes) > 0 {
			t.Errorf("%s: links changed %v with every Redis up", r.name, r.ev.changes)
		}
		r.ev.mu.Unlock()
	}
	local := runPaced(w, "per-region", p, 10*time.Millisecond, 2*time.Second, false)
	t.Logf("not global: admitted %v in %s", local.admitted, local.span.Round(time.Millisecond))
	for name, n := range local.admitted {
		// A loaded machine may send fewer than the pace asks.
		if want := 0.8 * min(float64(local.sent[name]), float64(p.Burst)+100*local.span.Seconds()); float64(n) < want {
			t.Errorf("not global: %s admitted %d of %d sent; want its own whole limit, %.0f at least", name, n, local.sent[name], want)
		}
	}
}

// TestRegionsCutOff: three regions as in TestRegionsBound; one region is
// cut off from the others (its proxies blackhole), then healed. No
// decision waits on a peer (a wait would take the exchange's 1 s
// timeout), every decision is the local Redis's, each region reports the
// link once as it fails and once as it heals, and each period stays
// within the bound: the cut's once more at most what a region admits
// unseen until the cut is seen (⌈burst/R⌉ + rate × LinkTimeout), the
// healed period within the bound alone (healing admits no burst).
func TestRegionsCutOff(t *testing.T) {
	const interval = 200 * time.Millisecond
	w := newWorld(t, 80*time.Millisecond, interval)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 30}
	time.Sleep(3 * interval)
	bound := regions.Bound(p, 3, interval, time.Second)
	link := regions.LinkTimeout(interval, time.Second)
	cutExtra := 10 + 100*(link+interval).Seconds() // ⌈burst/R⌉ + rate × (LinkTimeout + interval)
	check := func(phase string, res pacedResult, extra float64) {
		t.Helper()
		exact := float64(p.Burst) + 100*res.span.Seconds()
		t.Logf("%s: admitted %v = %d in %s; exact %.0f, bound %.0f + %.0f; slowest decision %s",
			phase, res.admitted, res.total(), res.span.Round(time.Millisecond), exact, bound, extra, res.slowest)
		if float64(res.total()) > exact+bound+extra {
			t.Errorf("%s: %d admitted; want at most %.0f", phase, res.total(), exact+bound+extra)
		}
		if res.slowest >= 500*time.Millisecond {
			t.Errorf("%s: a decision took %s: it waited on a peer", phase, res.slowest)
		}
		if res.failures > 0 {
			t.Errorf("%s: %d decisions were not the local Redis's", phase, res.failures)
		}
	}
	check("links up", runPaced(w, "cut", p, 10*time.Millisecond, 2*time.Second, true), 0)
	w.cut(t, "ap", true)
	check("ap cut off", runPaced(w, "cut", p, 10*time.Millisecond, link+3*time.Second, true), cutExtra)
	for _, r := range w.regions {
		if _, counted := r.l.RegionLinks(); counted != 1 {
			t.Errorf("%s counts %d regions admitting up to the rate while ap is cut off; want itself alone", r.name, counted)
		}
	}
	w.cut(t, "ap", false)
	time.Sleep(link) // the exchanges resume, the marks are back
	check("healed", runPaced(w, "cut", p, 10*time.Millisecond, 3*time.Second, true), 0)
	want := map[string][]string{"eu": {"ap up=false", "ap up=true"}, "us": {"ap up=false", "ap up=true"}}
	for _, r := range w.regions {
		r.ev.mu.Lock()
		got, heard := r.ev.changes, r.ev.heard
		r.ev.mu.Unlock()
		t.Logf("%s: links %v, marks %v", r.name, got, heard)
		if wantHeard := map[bool]int{true: 4, false: 2}[r.name == "ap"]; len(heard) != wantHeard {
			t.Errorf("%s: marks missing and back %v; want each of the cut links' once each way", r.name, heard)
		}
		if r.name == "ap" {
			if len(got) != 4 {
				t.Errorf("ap reported %v; want each link down once and up once", got)
			}
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(want[r.name]) {
			t.Errorf("%s reported %v; want %v", r.name, got, want[r.name])
		}
	}
}

// TestRegionsBanGlobal: a client banned by a global zone in one region is
// banned in the others within a few intervals (an exchange); a zone that
// is not global keeps its bans to its region.
func TestRegionsBanGlobal(t *testing.T) {
	const interval = 200 * time.Millisecond
	w := newWorld(t, 80*time.Millisecond, interval)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Hour, Burst: 3, Ban: limiter.Ban{After: 2, Within: time.Minute, For: time.Hour}}
	for _, global := range []bool{true, false} {
		req := limiter.Request{Zone: "login", Key: fmt.Sprint("banned-", global), Policy: p, Cost: 1, Global: global}
		eu := w.regions[0].l
		for range 5 {
			var v limiter.Verdict
			eu.Decide(context.Background(), time.Time{}, []limiter.Request{req}, limiter.Caller{Events: quietEvents{}}, &v)
			v.Release()
		}
		if left, err := eu.BanLeft(context.Background(), req); err != nil || left < 59*time.Minute {
			t.Fatalf("global %v: the client refused 4 times in eu is banned there for %s (%v); want an hour", global, left, err)
		}
		if !global {
			time.Sleep(2 * time.Second) // exchanges that would have told the ban
		}
		for _, r := range w.regions[1:] {
			// An exchange, a few round trips of 160 ms: the ban within 5 s.
			left, err := banWithin(r.l, req, 5*time.Second, global)
			switch {
			case err != nil:
				t.Fatalf("%s: %v", r.name, err)
			case global && left < 58*time.Minute:
				t.Errorf("global: the client banned in eu is banned in %s for %s; want the hour", r.name, left)
			case !global && left != 0:
				t.Errorf("not global: the client banned in eu is banned in %s too (%s)", r.name, left)
			}
		}
	}
}

// banWithin is how long req's client is banned in l once it is, within
// d when wait, else now.
func banWithin(l *limiter.Limiter, req limiter.Request, d time.Duration, wait bool) (time.Duration, error) {
	deadline := time.Now().Add(d)
	for {
		left, err := l.BanLeft(context.Background(), req)
		if err != nil || left > 0 || !wait || time.Now().After(deadline) {
			return left, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRegionsManyKeys: 10,000 client keys of a global zone, over every
// master's slots in ap (a Cluster), paced through eu and ap (4,000 a
// second, each key once in each) while us gets none of them: every
// exchange succeeds, us's Redis holds every key's
// charge (each bucket lacks what eu and ap admitted), and what the
// exchanges cost us's Redis per request is logged (the figure of
// BENCHMARKS.md: the scripts the exchanges ran there, and their CPU).
func TestRegionsManyKeys(t *testing.T) {
	const interval, keys = 200 * time.Millisecond, 10000
	w := newWorld(t, 80*time.Millisecond, interval)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Hour, Burst: 30}
	eu, us, ap := w.regions[0], w.regions[1], w.regions[2]
	time.Sleep(3 * interval)
	before := commandStats(t, us)
	sent := 0
	var wg sync.WaitGroup
	start := time.Now()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < 2*keys; i += 8 {
				time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / 4000))) // 4,000 a second in all
				r := []*region{eu, ap}[i%2]
				var v limiter.Verdict
				r.l.Decide(context.Background(), time.Time{}, []limiter.Request{{Zone: "many", Key: fmt.Sprint("k", i%keys), Policy: p, Cost: 1, Global: true}}, limiter.Caller{Events: quietEvents{}}, &v)
				if v.States[0] != limiter.Allowed {
					t.Errorf("key %d refused in %s: %v", i%keys, r.name, v.States[0])
				}
				v.Release()
			}
		}()
	}
	wg.Wait()
	sent = 2 * keys
	time.Sleep(4 * interval) // the last exchanges
	after := commandStats(t, us)
	calls, usec := after.scripts()
	calls0, usec0 := before.scripts()
	t.Logf("%d requests of %d keys through eu and ap: us's Redis ran %d exchange scripts (%.5f a request), %.1f µs of script CPU a request, "+
		"the Lua calls within included; %d marks read",
		sent, keys, calls-calls0, float64(calls-calls0)/float64(sent), float64(usec-usec0)/float64(sent), after["getrange"][0]-before["getrange"][0])
	for _, r := range []*region{eu, ap} {
		r.ev.mu.Lock()
		t.Logf("%s: exchanges %v (ok, failed), first failures %v", r.name, r.ev.exchanges, r.ev.failures)
		for peer, n := range r.ev.exchanges {
			// A loaded machine may keep an exchange past its 1 s timeout:
			// at most two of them, and ten that succeed.
			if n[1] > 2 || n[0] < 10 {
				t.Errorf("%s: exchanges with %s %v (ok, failed); want at least 10 ok, at most 2 failed", r.name, peer, n)
			}
		}
		r.ev.mu.Unlock()
	}
	for _, i := range []int{0, 1, keys / 2, keys - 1} {
		d, err := us.l.Peek(context.Background(), limiter.Request{Zone: "many", Key: fmt.Sprint("k", i), Policy: p, Global: true})
		if err != nil || d.Remaining != (30-2)/3 { // us's part of the room eu and ap left: charged by both
			t.Errorf("key %d in us: %+v (%v); want 9 left, (30 - 2) / 3: charged by eu and ap", i, d, err)
		}
	}
}

// cmdStats are INFO commandstats by command: calls and µs.
type cmdStats map[string][2]int64

// scripts is the calls of scripts (EVALSHA and EVAL) and their µs, the
// commands they ran within included.
func (c cmdStats) scripts() (calls, usec int64) {
	return c["evalsha"][0] + c["eval"][0], c["evalsha"][1] + c["eval"][1]
}

// commandStats is r's Redis's INFO commandstats.
func commandStats(t *testing.T, r *region) cmdStats {
	t.Helper()
	c := r.client()
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	stats := cmdStats{}
	for line := range strings.SplitSeq(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		var v [2]int64
		for field := range strings.SplitSeq(rest, ",") {
			k, n, _ := strings.Cut(field, "=")
			switch k {
			case "calls":
				v[0], _ = strconv.ParseInt(n, 10, 64)
			case "usec":
				v[1], _ = strconv.ParseInt(n, 10, 64)
			}
		}
		stats[name] = v
	}
	return stats
}

// TestRegionsOneLinkCut: the link between eu and us alone is cut, for
// ten seconds, both still exchanging with ap. Each of eu and us counts
// itself alone (the other may admit unseen), so the regions together stay
// within the bound and the cut's once-only excess over the whole cut; a
// region that counted the peers it still reaches (eu and us at two
// thirds of the rate each, unseen by each other) would go over by a
// third of the rate for as long as the cut lasts.
func TestRegionsOneLinkCut(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 300 * time.Millisecond
	w := newWorldTimeout(t, 20*time.Millisecond, interval, timeout)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 30}
	time.Sleep(3 * interval)
	bound := regions.Bound(p, 3, interval, timeout)
	link := regions.LinkTimeout(interval, timeout)
	w.cutLink(t, "eu", "us", true)
	res := runPaced(w, "one-link", p, 10*time.Millisecond, 10*time.Second, true)
	exact := float64(p.Burst) + 100*res.span.Seconds()
	extra := 10 + 100*(link+interval).Seconds()
	t.Logf("eu-us cut: admitted %v = %d in %s; exact %.0f, bound %.0f + the cut's %.0f; slowest decision %s",
		res.admitted, res.total(), res.span.Round(time.Millisecond), exact, bound, extra, res.slowest)
	if float64(res.total()) > exact+bound+extra {
		t.Errorf("%d admitted with one link cut; want at most %.0f", res.total(), exact+bound+extra)
	}
	for _, r := range w.regions {
		if _, counted := r.l.RegionLinks(); (counted == 1) != (r.name != "ap") {
			t.Errorf("%s counts %d regions admitting up to the rate; want 1 in eu and us, 3 in ap", r.name, counted)
		}
	}
	w.cutLink(t, "eu", "us", false)
}

// TestRegionsRollout: a zone global in eu and not (yet) in us, as while
// global rolls out region by region: what eu admits is charged to the
// zone's global bucket in us, never to the bucket us decides by, and us
// keeps its own limit.
func TestRegionsRollout(t *testing.T) {
	const interval = 200 * time.Millisecond
	w := newWorld(t, 20*time.Millisecond, interval)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Hour, Burst: 30}
	eu, us := w.regions[0], w.regions[1]
	decide := func(r *region, global bool) limiter.State {
		var v limiter.Verdict
		r.l.Decide(context.Background(), time.Time{}, []limiter.Request{{Zone: "rollout", Key: "k", Policy: p, Cost: 1, Global: global}}, limiter.Caller{Events: quietEvents{}}, &v)
		defer v.Release()
		return v.States[0]
	}
	for range 10 {
		decide(eu, true)
	}
	time.Sleep(5 * interval) // exchanges
	d, err := us.l.Peek(context.Background(), limiter.Request{Zone: "rollout", Key: "k", Policy: p})
	if err != nil || d.Remaining != 30 {
		t.Fatalf("us's own bucket of the zone after eu admitted 10 as global: %+v (%v); want 30 left, untouched", d, err)
	}
	g, err := us.l.Peek(context.Background(), limiter.Request{Zone: "rollout", Key: "k", Policy: p, Global: true})
	if err != nil || g.Remaining != (30-10)/3 {
		t.Errorf("us's global bucket after eu admitted 10: %+v (%v); want 6 left, its part of the room, (30 - 10) / 3", g, err)
	}
}

// TestRegionsStartDuringPartition: an instance that starts in a region cut
// off from the others (a restart during a partition) decides its global
// zones with the region's share from its first request, having told and
// heard no peer: over its first LinkTimeout it admits at most the share of
// the burst and rate / R, not the whole rate until its links time out.
func TestRegionsStartDuringPartition(t *testing.T) {
	const interval = 200 * time.Millisecond
	w := newWorld(t, 80*time.Millisecond, interval)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 30}
	link := regions.LinkTimeout(interval, time.Second)
	ap := w.regions[2]
	w.cut(t, ap.name, true)
	time.Sleep(link + 2*interval) // the marks of ap in the others, and theirs in ap, expire
	l := ap.instance(t)
	req := limiter.Request{Zone: "api", Key: "restarted", Policy: p, Cost: 1, Global: true}
	admitted, sent := 0, 0
	start := time.Now()
	for ; time.Since(start) < link; time.Sleep(3 * time.Millisecond) { // 3 times the whole rate
		var v limiter.Verdict
		l.Decide(context.Background(), time.Time{}, []limiter.Request{req}, limiter.Caller{Events: quietEvents{}}, &v)
		if v.States[0] == limiter.Allowed {
			admitted++
		}
		sent++
		v.Release()
	}
	took := time.Since(start)
	share := 10 + 100.0/3*(took+interval).Seconds() // ⌈burst/R⌉ + rate/R, an interval's slack
	_, counted := l.RegionLinks()
	t.Logf("started cut off: admitted %d of %d in %s (share: at most %.0f; the whole rate: %.0f), regions counted %d",
		admitted, sent, took.Round(time.Millisecond), share, 10+100*took.Seconds(), counted)
	if float64(admitted) > share {
		t.Errorf("an instance started cut off admitted %d in %s; want at most its region's share, %.0f", admitted, took.Round(time.Millisecond), share)
	}
	if admitted < 10 {
		t.Errorf("an instance started cut off admitted %d; want at least the share of the burst, 10", admitted)
	}
	if counted != 1 {
		t.Errorf("an instance started cut off counts %d regions; want itself alone", counted)
	}
}
