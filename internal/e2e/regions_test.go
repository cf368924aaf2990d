package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/latencyproxy"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// A world of three regions on loopback: eu (two Caddys) and us (one) on
// Redis servers of their own, ap (one Caddy) on a 3-master Cluster. Each
// region reaches the others' Redis through a proxy of its own per link
// that delays 80 ms each way (internal/latencyproxy). The Cluster's peers
// reach it through a proxy to one node, which tells them the nodes'
// addresses: only that connection is delayed (and cut). A region cut off
// still reaches the Cluster's nodes, which no longer reach it: the test
// of a cut is, with ap, the test of a link that fails one way.

// regionsWorld is the Caddys of a world, in a fleetScenario (eu, eu, us,
// ap), and the proxies of the links, by the region of each end.
type regionsWorld struct {
	*fleetScenario
	region  []string // of each Caddy
	proxies map[[2]string]*latencyproxy.Proxy
	secret  map[string]string // each region's key_secret, if any
}

const (
	regionsSync  = 200 * time.Millisecond
	regionsDelay = 80 * time.Millisecond
)

func startRegions(t *testing.T) *regionsWorld { return startRegionsWith(t, nil) }

// startRegionsWith starts a world whose regions digest their client keys
// with the key_secret secret gives them.
func startRegionsWith(t *testing.T, secret map[string]string) *regionsWorld {
	t.Helper()
	cl := redistest.NewClusterOf(t, 3, 0)
	redis := map[string][]string{"eu": {redistest.NewServer(t).Addr}, "us": {redistest.NewServer(t).Addr}, "ap": cl.Addrs()}
	w := &regionsWorld{fleetScenario: &fleetScenario{t: t, prefix: fmt.Sprintf("regions%d:", time.Now().UnixNano())},
		proxies: map[[2]string]*latencyproxy.Proxy{}, secret: secret}
	for from := range redis {
		for to, addrs := range redis {
			if from == to {
				continue
			}
			p, err := latencyproxy.Start(addrs[0], regionsDelay)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			w.proxies[[2]string{from, to}] = p
		}
	}
	for _, name := range []string{"eu", "eu", "us", "ap"} {
		w.caddys = append(w.caddys, testcaddy.Start(t, w.site(name, redis[name])))
		w.region = append(w.region, name)
	}
	return w
}

// site is the site of a Caddy of region name on its Redis addrs: /api is
// global, /local is not; both 100 a second, burst 30.
func (w *regionsWorld) site(name string, addrs []string) string {
	var peers strings.Builder
	for to := range map[string]bool{"eu": true, "us": true, "ap": true} {
		if to == name {
			continue
		}
		cluster := "" // a seed of the Cluster
		if to == "ap" {
			cluster = "\t\t\t\tcluster\n"
		}
		fmt.Fprintf(&peers, "\t\t\t%s {\n\t\t\t\taddresses %s\n%s\t\t\t\tkey_prefix %s\n\t\t\t}\n", to, w.proxies[[2]string{name, to}].Addr(), cluster, w.prefix)
	}
	zone := func(zone, path, global string) string {
		return fmt.Sprintf("\t\tzone %s {\n\t\t\tmatch {\n\t\t\t\tpath %s\n\t\t\t}\n\t\t\tkey {http.request.header.X-API-Key}\n\t\t\trate 100r/s\n\t\t\tburst 30\n%s\t\t}\n", zone, path, global)
	}
	secret := ""
	if s := w.secret[name]; s != "" {
		secret = "\t\t\tkey_secret " + s + "\n"
	}
	return fmt.Sprintf("\trate_limit {\n\t\tredis {\n\t\t\taddresses %s\n\t\t\tkey_prefix %s\n\t\t\ttimeout 1s\n%s\t\t}\n"+
		"\t\tregions %s {\n%s\t\t\tsync %s\n\t\t}\n\t\ton_store_error deny\n%s%s%s\t}\n\trespond \"ok\"\n",
		strings.Join(addrs, " "), w.prefix, secret, name, peers.String(), regionsSync, zone("api", "/api", "\t\t\tglobal\n"), zone("local", "/local", ""),
		quotaZone)
}

// cut cuts (or heals) every link into and out of region.
func (w *regionsWorld) cut(region string, cut bool) {
	for ends, p := range w.proxies {
		if ends[0] != region && ends[1] != region {
			continue
		}
		if cut {
			p.Cut()
		} else if err := p.Heal(); err != nil {
			w.t.Fatal(err)
		}
	}
}

// boundLogged is the bound each Caddy logged for the global zone api.
func (w *regionsWorld) boundLogged() float64 {
	w.t.Helper()
	bound := -1.0
	for _, c := range w.caddys {
		line := ""
		for _, l := range strings.Split(c.WaitLogs(`"zone is global`), "\n") {
			if strings.Contains(l, `"zone is global`) && strings.Contains(l, `"zone":"api"`) {
				line = l
				break
			}
		}
		var l struct {
			Zone    string
			Regions []string
			Bound   float64
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.Zone != "api" || len(l.Regions) != 3 {
			w.t.Fatalf("the bound logged: %s (%v)", line, err)
		}
		bound = max(bound, l.Bound)
	}
	return bound
}

// paced sends key on path through every Caddy in turn, 100 a second
// through each, for d, and returns the shots.
func (w *regionsWorld) paced(path, key string, d time.Duration) []shot {
	n := len(w.caddys)
	p := w.pace(float64(100*n), math.MaxInt, d, func(i int) (int, string, string) { return i % n, path, key })
	time.Sleep(d)
	return p.Stop()
}

// check checks shots of the global zone: at most the exact limit over
// their span plus bound; no request slower than the exchange's timeout
// (one that waited on a peer), none but 200 or 429.
func (w *regionsWorld) check(phase string, shots []shot, bound float64) {
	w.t.Helper()
	ok, sent := admitted(shots, "/api")
	exact := 30 + 100*span(shots).Seconds()
	var slowest time.Duration
	statuses := map[int]int{}
	for _, s := range shots {
		slowest = max(slowest, s.done.Sub(s.sent))
		statuses[s.status]++
	}
	w.t.Logf("%s: %d admitted of %d in %s; exact %.0f, bound %.0f more; statuses %v, slowest %s",
		phase, ok, sent, span(shots).Round(time.Millisecond), exact, bound, statuses, slowest)
	if float64(ok) > exact+bound {
		w.t.Errorf("%s: %d admitted in all regions; want at most the exact %.0f plus %.0f", phase, ok, exact, bound)
	}
	if statuses[200]+statuses[429] != sent {
		w.t.Errorf("%s: statuses %v; want only 200 and 429", phase, statuses)
	}
	if slowest >= time.Second {
		w.t.Errorf("%s: a request took %s: it waited on a peer region", phase, slowest)
	}
}

// TestRegionsEndToEnd (issue 35): one client spread over the three
// regions at the zone's rate through each Caddy (four times the rate in
// all) is admitted, in all regions together, at most the exact limit
// plus the bound each Caddy logged, and most of the limit; without
// global each region grants the whole limit. Then eu is cut off (from
// ap one way: see regionsWorld): no request waits on a peer, none fails,
// and each Caddy reports each link to or from eu that fails down once; the period stays within the bound and what a
// region admits unseen until the cut is seen. Healed: each link is
// reported back once, and the next period stays within the bound alone.
func TestRegionsEndToEnd(t *testing.T) {
	t.Parallel()
	w := startRegions(t)
	bound := w.boundLogged()
	time.Sleep(3 * regionsSync) // every region's mark reaches the others
	w.check("links up", w.paced("/api", "spread", 4*time.Second), bound)
	if ok, _ := admitted(w.paced("/api", "spread-2", 2*time.Second), "/api"); ok < 150 {
		t.Errorf("a second client got %d admitted in 2 s; want most of its 230", ok)
	}
	w.perRegion(w.paced("/local", "local", 2*time.Second))
	w.oneRegion(bound)
	w.quota()

	link := 2 * (regionsSync + time.Second) // regions.LinkTimeout
	w.cut("eu", true)
	w.check("eu cut off", w.paced("/api", "cut", link+2*time.Second), bound+10+100*(link+regionsSync).Seconds())
	w.cut("eu", false)
	time.Sleep(link)
	w.check("healed", w.paced("/api", "cut", 3*time.Second), bound)
	w.checkLinkLogs()
}

// oneRegion: one client sends through eu's Caddys alone, at three times
// the rate, for 3 s. It gets what the exact limit admits of the same
// requests (30 and 100 a second), not the region's share of the burst
// (10), but for what its first sync and timeout (D, 1.2 s), before eu
// holds the whole burst, may hold back: there eu spends unseen its part
// of the room and of the refill, at most rate × D less than the exact.
func (w *regionsWorld) oneRegion(bound float64) {
	w.t.Helper()
	p := w.pace(300, math.MaxInt, 3*time.Second, func(i int) (int, string, string) { return i % 2, "/api", "eu-only" })
	time.Sleep(3 * time.Second)
	shots := p.Stop()
	ok, sent := admitted(shots, "/api")
	times := make([]time.Time, 0, len(shots))
	for _, s := range shots {
		times = append(times, s.sent)
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	exact, tat := 0, time.Time{} // one token bucket: burst 30, 100 a second
	for _, at := range times {
		if next := later(tat, at).Add(10 * time.Millisecond); next.Sub(at) <= 300*time.Millisecond {
			tat, exact = next, exact+1
		}
	}
	w.t.Logf("one region: %d admitted of %d; the exact limit %d", ok, sent, exact)
	if held := 100 * (regionsSync + time.Second).Seconds(); float64(ok) < float64(exact)-held || float64(ok) > float64(exact)+bound {
		w.t.Errorf("one region: %d admitted; want the exact limit's %d, less %.0f at most", ok, exact, held)
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// perRegion checks shots of the zone that is not global: each region
// grants the whole limit (eu's two Caddys share eu's).
func (w *regionsWorld) perRegion(shots []shot) {
	w.t.Helper()
	by := map[string]int{}
	for _, s := range shots {
		if s.status == 200 {
			by[w.region[s.via]]++
		}
	}
	want := 0.8 * (30 + 100*span(shots).Seconds())
	w.t.Logf("not global: admitted by region %v in %s", by, span(shots).Round(time.Millisecond))
	for _, r := range []string{"eu", "us", "ap"} {
		if float64(by[r]) < want {
			w.t.Errorf("not global: %s admitted %d; want its whole limit, %.0f at least", r, by[r], want)
		}
	}
}

// checkLinkLogs checks that each Caddy reported each link to or from eu
// down once and back once, and no other link.
func (w *regionsWorld) checkLinkLogs() {
	w.t.Helper()
	for i, c := range w.caddys {
		down, back := map[string]int{}, map[string]int{}
		for line := range strings.SplitSeq(c.Logs(), "\n") {
			var l struct{ Msg, Region string }
			if json.Unmarshal([]byte(line), &l) != nil {
				continue
			}
			if strings.HasPrefix(l.Msg, "the link to a region is") {
				w.t.Logf("Caddy %d (%s): %s", i, w.region[i], line)
			}
			switch {
			case strings.HasPrefix(l.Msg, "the link to a region is down"):
				down[l.Region]++
			case strings.HasPrefix(l.Msg, "the link to a region is back"):
				back[l.Region]++
			}
		}
		want := map[string]int{"eu": 1}
		if w.region[i] == "eu" { // eu reaches ap's nodes but its seed directly
			want = map[string]int{"us": 1}
		}
		if fmt.Sprint(down) != fmt.Sprint(want) || fmt.Sprint(back) != fmt.Sprint(want) {
			w.t.Errorf("Caddy %d (%s) reported links down %v, back %v; want %v each", i, w.region[i], down, back, want)
		}
	}
}

// TestRegionsKeySecretDiffers: eu's Caddys digest client keys under
// another key_secret than us's and ap's (the peers' blocks leave it out,
// as the docs advise). Each region finds the others' fingerprint differs,
// logs it once naming key_secret, and decides with its share: one client
// spread over the regions stays within the exact limit plus the bound.
func TestRegionsKeySecretDiffers(t *testing.T) {
	t.Parallel()
	w := startRegionsWith(t, map[string]string{"eu": "eu-secret-0123456789", "us": "us-ap-secret-0123456789", "ap": "us-ap-secret-0123456789"})
	bound := w.boundLogged()
	for _, c := range w.caddys {
		c.WaitLogs(`a region's config differs`)
	}
	w.check("key_secret differs", w.paced("/api", "secret", 3*time.Second), bound)
	for i, c := range w.caddys {
		n := 0
		for line := range strings.SplitSeq(c.Logs(), "\n") {
			var l struct{ Msg, Region, Differs string }
			if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Msg, "a region's config differs") {
				n++
				if l.Differs != "key_secret" || (w.region[i] == "eu") != (l.Region != "eu") {
					t.Errorf("Caddy %d (%s): %s; want key_secret, of a region with the other secret", i, w.region[i], line)
				}
			}
		}
		if want := map[bool]int{true: 2, false: 1}[w.region[i] == "eu"]; n != want {
			t.Errorf("Caddy %d (%s) logged %d regions whose config differs; want %d, once each", i, w.region[i], n, want)
		}
	}
}

// TestRegionsOverrides: an override of a global zone set through one
// region's admin API is written to the others' Redis (the answer says
// so), and is in force in every region within a few seconds; one of a
// zone that is not global stays in its region; one made while a region
// is cut off reaches it when the link heals.
func TestRegionsOverrides(t *testing.T) {
	t.Parallel()
	w := startRegions(t)
	eu := w.caddys[0]
	_, _, out := adminBody(t, eu, http.MethodPut, "/rate_limit/overrides/api", `{"rate": "7r/m", "burst": 7}`)
	var put struct{ Regions map[string]string }
	if err := json.Unmarshal([]byte(out), &put); err != nil || put.Regions["us"] != "written" || put.Regions["ap"] != "written" {
		t.Fatalf("PUT an override of the global zone: %s; want it written in us and ap", out)
	}
	putOverride(t, eu, http.MethodPut, "local", `{"rate": "9r/m"}`)
	for i, c := range w.caddys {
		start := time.Now()
		for !strings.Contains(listed(t, c), `"zone":"api"`) {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("Caddy %d (%s): the global zone's override is not in force within 5 s: %s", i, w.region[i], listed(t, c))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got := limitOn(t, c, "/api", "override"); got != "7" { // the world's: a region holds ⌈7/3⌉ or all
			t.Errorf("Caddy %d (%s): limit %q under the override; want the override's 7", i, w.region[i], got)
		}
		_, _, got := admin(t, c, http.MethodGet, "/rate_limit/zones/api/keys/override")
		if !strings.Contains(got, `"limit":7,`) || !strings.Contains(got, `"config_limit":30,`) {
			t.Errorf("Caddy %d (%s): lookup %s; want the world's limit 7 and config_limit 30", i, w.region[i], got)
		}
		if has := strings.Contains(listed(t, c), `"zone":"local"`); has != (w.region[i] == "eu") {
			t.Errorf("Caddy %d (%s): lists the override of the zone that is not global: %v", i, w.region[i], has)
		}
	}
	w.checkQueuedOverride()
}

// checkQueuedOverride: with us cut off, a change of the global zone's
// override through eu is queued for us (the answer says so, within the
// peer's timeout), and in force in us once the link heals.
func (w *regionsWorld) checkQueuedOverride() {
	w.t.Helper()
	w.cut("us", true)
	start := time.Now()
	_, _, out := adminBody(w.t, w.caddys[0], http.MethodPut, "/rate_limit/overrides/api", `{"rate": "8r/m", "burst": 8}`)
	var put struct{ Regions map[string]string }
	if err := json.Unmarshal([]byte(out), &put); err != nil || !strings.HasPrefix(put.Regions["us"], "queued") || put.Regions["ap"] != "written" {
		w.t.Fatalf("PUT with us cut off: %s; want it queued for us, written in ap", out)
	}
	w.t.Logf("PUT with us cut off answered in %s: %v", time.Since(start).Round(time.Millisecond), put.Regions)
	w.cut("us", false)
	us := w.caddys[2]
	for start := time.Now(); !strings.Contains(listed(w.t, us), `"rate":"8r/m"`); time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			w.t.Fatalf("us healed: the queued override is not in force within 10 s: %s", listed(w.t, us))
		}
	}
}

// listed is c's listing of the overrides in force.
func listed(t *testing.T, c *testcaddy.Caddy) string {
	t.Helper()
	_, _, body := admin(t, c, http.MethodGet, "/rate_limit/overrides")
	return body
}
