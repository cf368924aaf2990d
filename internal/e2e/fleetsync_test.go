package e2e

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// Zones that sync in the fleet scenario (fleet_test.go): thousands of keys
// through three instances on a Cluster, with a master restarted and a
// failover meanwhile, then one key blasted; and windows at a paced rate.
// Each zone admits at most what the exact limit would over the period
// plus the bound its instances stated (docs/rate_limit.md, sync).

// manyKeysSite: on /all, a token bucket of 100r/s (burst 100) that syncs
// every 100ms, and a fixed window and a sliding window counter of 6 a 2s
// that sync every 200ms; each zone also on a path of its own. An
// instance's share of a window of 6 is small: its second request of a key
// spends half of it, so every key that the traffic sends twice through
// one instance is charged at the next round.
func manyKeysSite(prefix string, addrs []string) string {
	return syncSite(prefix, addrs,
		syncZone("tb", "/all /tb", "", "100r/s", "100ms"),
		syncZone("fw", "/all /fw", "fixed_window", "6r/2s", "200ms"),
		syncZone("swc", "/all /swc", "sliding_window_counter", "6r/2s", "200ms"))
}

// manyKeysRate is the many-key traffic's pace (requests a second, over
// the three instances): 3,000 keys sent twice in 10 seconds.
const manyKeysRate = 600

// manyKeysTraffic sends each key twice through one instance, the second
// time 64 requests after the first (it was answered: the instance has the
// bucket's entry, and admits it on its own), in blocks of 64 keys; each
// pass over the keys goes through the next instance.
func manyKeysTraffic(keys []string) func(i int) (int, string, string) {
	const block = 64
	return func(i int) (int, string, string) {
		n := i/(2*block)*block + i%block // the key's turn, over all passes
		k := n % len(keys)
		return (k + n/len(keys)) % 3, "/all", keys[k]
	}
}

// TestSyncFleetManyKeys: 3,000 client keys, on every master's slots, at a
// paced rate through three instances on a 3-master Cluster (issue 32).
// Every sync round succeeds and Redis counts no error; a master restarted
// and a failover (and back) during the traffic may fail rounds while they
// last, not after. Then one key blasted through the three instances is
// admitted at most the exact limit plus the stated bound, in each zone.
func TestSyncFleetManyKeys(t *testing.T) {
	cl := redistest.NewClusterOf(t, 3, 1) // its own: a master restarts, another fails over
	f := startFleet(t, cl.Addrs(), manyKeysSite)
	keys := clientKeys("many", 3000)
	perMaster := f.keysPerMaster("tb", keys)
	ms := masters(t, cl)
	for _, m := range ms {
		if perMaster[m] < len(keys)/6 { // a third each, give or take
			t.Fatalf("keys by master %v: the keys do not cover every master's slots", perMaster)
		}
	}
	base := errorStats(t, cl.Addrs())
	traffic := f.pace(manyKeysRate, math.MaxInt, 3*time.Minute, manyKeysTraffic(keys))
	if !traffic.Wait(2*len(keys), time.Minute) {
		t.Fatalf("the traffic sent fewer than %d requests in a minute", 2*len(keys))
	}
	time.Sleep(time.Second) // the rounds that charge the last keys sent
	f.checkClean(base, len(keys))
	t.Logf("keys by master %v; restarting %s, failing %s over and back", perMaster, ms[0], ms[1])
	began := time.Now()
	restartMaster(t, cl, ms[0])
	restarted := time.Now()
	failoverAndBack(t, cl, ms[1])
	t.Logf("the restart took %s, the failover and back %s; sync rounds %+v",
		restarted.Sub(began).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond), f.syncs())
	// The breakers of the nodes that failed stay open for 2s, then a probe:
	// rounds may fail until then.
	time.Sleep(4 * time.Second)
	recovered, mark := f.syncs(), f.logMarks()
	time.Sleep(4 * time.Second)
	after := f.syncs()
	shots := traffic.Stop()
	ok, sent := admitted(shots, "/all")
	t.Logf("many keys: %d requests, %d admitted; sync rounds %+v after the faults' end, %+v 4s later", sent, ok, recovered, after)
	if after.ok <= recovered.ok {
		t.Errorf("sync rounds after the faults' end: %+v, then %+v 4s later; want more ok", recovered, after)
	}
	if after.err != recovered.err {
		f.stallsOnly(mark, after.err-recovered.err)
	}
	for addr, kinds := range errorStats(t, cl.Addrs()) {
		if kinds["CROSSSLOT"] > 0 {
			t.Errorf("%s counted %d CROSSSLOT errors since its start", addr, kinds["CROSSSLOT"])
		}
	}
	f.blastWithinBound("blast")
}

// checkClean checks that after keys were sent through the fleet, Redis up
// all along, every sync round succeeded (some ran), and no Redis node
// counted an error since base but NOSCRIPT (a script's first use) and
// CLIENT SETINFO's (an ERR of no command; see errorStats): each node's
// failed and refused calls are its NOSCRIPTs.
func (f *fleetScenario) checkClean(base map[string]map[string]int64, keys int) {
	f.t.Helper()
	n := f.syncs()
	grew := newErrors(base, errorStats(f.t, f.addrs))
	f.t.Logf("%d keys sent, Redis up: sync rounds %+v; errors counted by Redis since the fleet started %v", keys, n, grew)
	if n.err != 0 || n.ok == 0 {
		f.t.Errorf("%d keys sent, Redis up: sync rounds %+v; want only ok", keys, n)
	}
	for addr, kinds := range grew {
		calls := int64(0)
		for kind, count := range kinds {
			if c, ok := strings.CutPrefix(kind, "calls "); ok {
				calls += count
				f.t.Logf("%s: %d calls of %s failed or were refused", addr, count, c)
			} else if kind != "NOSCRIPT" && kind != "ERR" {
				f.t.Errorf("%d keys sent, Redis up: %s counted %d %s errors", keys, addr, count, kind)
			}
		}
		if calls != kinds["NOSCRIPT"] {
			f.t.Errorf("%d keys sent, Redis up: %s counted %d failed or refused calls, %d of them NOSCRIPT", keys, addr, calls, kinds["NOSCRIPT"])
		}
	}
}

// blastWithinBound floods key on /tb, /fw and /swc through the fleet for
// 4s; each zone admits at most the exact limit over the flood plus its
// stated bound.
func (f *fleetScenario) blastWithinBound(key string) {
	f.t.Helper()
	shots := f.flood(4*time.Second, key, "/tb", "/fw", "/swc")
	f.checkWindows(shots, 6, 2*time.Second)
	tb := tokenBucketExact(onPath(shots, "/tb"), 100, 100)
	f.withinBound("tb", onPath(shots, "/tb"), tb, tb/2)
}

// withinBound checks that zone admitted of shots at most exact plus the
// bound its instances stated, and at least least: sync must not refuse
// what the limit allows.
func (f *fleetScenario) withinBound(zone string, shots []shot, exact, least int) {
	f.t.Helper()
	bound := f.statedBound(zone)
	ok, sent := admitted(shots, shots[0].path)
	key := shots[0].key
	f.t.Logf("zone %s, key %s: %d admitted of %d sent in %s; exact %d, stated bound %.0f more",
		zone, key, ok, sent, span(shots).Round(time.Millisecond), exact, bound)
	if float64(ok) > float64(exact)+bound {
		f.t.Errorf("zone %s, key %s: %d admitted; want at most the exact %d plus the stated bound %.0f", zone, key, ok, exact, bound)
	}
	if ok < least {
		f.t.Errorf("zone %s, key %s: %d admitted; want at least %d", zone, key, ok, least)
	}
}

// TestSyncFleetPacedWindows: a fixed window and a sliding window counter
// of 30 a 2s that sync every 200ms; through three instances, round-robin,
// for six windows, one key at 1.5 times the limit, another at 10 times
// (issue 32: a synced fixed window admitted over its limit in every
// window, the more so as the rate grows). Each key admits at most the
// exact limit over the run plus the stated bound.
func TestSyncFleetPacedWindows(t *testing.T) {
	f := startFleet(t, redistest.ClusterAddrs(t), func(prefix string, addrs []string) string {
		return syncSite(prefix, addrs,
			syncZone("fw", "/fw", "fixed_window", "30r/2s", "200ms"),
			syncZone("swc", "/swc", "sliding_window_counter", "30r/2s", "200ms"))
	})
	const limit, window, windows = 30, 2 * time.Second, 6
	paths := []string{"/fw", "/swc"}
	var pacers []*pacer
	for _, times := range []float64{1.5, 10} {
		key := fmt.Sprintf("paced-%gx", times)
		rate := 2 * times * limit / window.Seconds() // two zones
		pacers = append(pacers, f.pace(rate, math.MaxInt, windows*window, func(i int) (int, string, string) {
			return i / 2 % 3, paths[i%2], key
		}))
	}
	time.Sleep(windows * window)
	for _, p := range pacers {
		f.checkWindows(p.Stop(), limit, window)
	}
}

// checkWindows checks the shots on /fw and /swc, zones fw and swc of limit
// a window: each admits at most the exact limit plus the stated bound.
// The fixed window admits at least half what the exact one would; the
// sliding window counter, whose exact figure is less than windowExact
// (a window's count is weighed down by the previous one's), at least one
// window's limit.
func (f *fleetScenario) checkWindows(shots []shot, limit int, window time.Duration) {
	f.t.Helper()
	fw, swc := onPath(shots, "/fw"), onPath(shots, "/swc")
	exact := windowExact(fw, limit, window)
	// At least a third: each of the three instances' share of every
	// window, what rounds that lag on a loaded machine still leave (12 of
	// an exact 27 was seen there, against 13 for a half).
	f.withinBound("fw", fw, exact, exact/3)
	f.withinBound("swc", swc, windowExact(swc, limit, window), limit)
}

// onPath are the shots on path.
func onPath(shots []shot, path string) []shot {
	var on []shot
	for _, s := range shots {
		if s.path == path {
			on = append(on, s)
		}
	}
	return on
}

// span is the time from the first shot sent to the last answered.
func span(shots []shot) time.Duration {
	first, last := shots[0].sent, shots[0].done
	for _, s := range shots {
		if s.sent.Before(first) {
			first = s.sent
		}
		if s.done.After(last) {
			last = s.done
		}
	}
	return last.Sub(first)
}

// tokenBucketExact is the most an exact token bucket of burst and rate a
// second, full at the start, admits of shots: the burst and what it
// refills from the first shot sent to the last answered.
func tokenBucketExact(shots []shot, burst, rate float64) int {
	return min(len(shots), int(math.Ceil(burst+rate*span(shots).Seconds())))
}

// windowExact is the most an exact fixed window of limit a window admits
// of shots: in each window (windows start at multiples of their length),
// the first limit sent in it. A sliding window counter admits no more (the
// current window's count is at most the limit). A shot sent in a window
// and answered in the next was decided in either: one more for each.
func windowExact(shots []shot, limit int, window time.Duration) int {
	sent := map[int64]int{}
	n := 0
	for _, s := range shots {
		w := s.sent.UnixNano() / int64(window)
		sent[w]++
		if s.done.UnixNano()/int64(window) != w {
			n++
		}
	}
	for _, c := range sent {
		n += min(c, limit)
	}
	return n
}
