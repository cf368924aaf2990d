package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// TestZipf: the draws follow the shares, 1/(k+1)^s over their sum; s 0
// is uniform.
func TestZipf(t *testing.T) {
	for _, s := range []float64{0, 0.8, 1.2} {
		z := newZipf(100, s)
		rng := rand.New(rand.NewPCG(1, 2))
		counts := make([]int, 100)
		const n = 400_000
		for range n {
			counts[z.draw(rng)]++
		}
		sum := 0.0
		for k := range 100 {
			sum += math.Pow(float64(k+1), -s)
		}
		for _, k := range []int{0, 1, 9, 99} {
			want := math.Pow(float64(k+1), -s) / sum
			if got := z.share(k); math.Abs(got-want) > 1e-12 {
				t.Errorf("s %g: share of key %d %g, want %g", s, k, got, want)
			}
			got := float64(counts[k]) / n
			if tol := 5*math.Sqrt(want/n) + 1e-4; math.Abs(got-want) > tol {
				t.Errorf("s %g: key %d drawn %.5f of the time, want %.5f ± %.5f", s, k, got, want, tol)
			}
		}
	}
}

// TestRecord: a record gives back its key, time (to the µs) and admission,
// and records sort by key, then time.
func TestRecord(t *testing.T) {
	for _, tc := range []struct {
		key      int
		at       time.Duration
		admitted bool
	}{{0, 0, false}, {7, 1500 * time.Microsecond, true}, {1<<31 - 1, time.Hour, true}} {
		k, at, a := unrecord(record(tc.key, tc.at, tc.admitted))
		if k != tc.key || at != tc.at || a != tc.admitted {
			t.Errorf("record(%d, %s, %v) gave back %d, %s, %v", tc.key, tc.at, tc.admitted, k, at, a)
		}
	}
	if _, at, _ := unrecord(record(1, -time.Second, true)); at != 0 {
		t.Errorf("a time before the start gave back %s, want 0", at)
	}
	recs := []uint64{record(2, time.Millisecond, false), record(1, 2*time.Second, true), record(1, time.Second, false)}
	slices.Sort(recs)
	if k, at, _ := unrecord(recs[0]); k != 1 || at != time.Second {
		t.Errorf("sorted first: key %d at %s, want key 1 at 1s", k, at)
	}
}

// TestReplay: the replay is one token bucket of the zone's whole rate and
// burst per key, in time order, whatever the order of the records; the
// fleet's excess, its refusals within the limit and the classes of load
// are counted per key.
func TestReplay(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Second, Burst: 3}
	var recs []uint64
	// Key 0: 5 at once, then one 2 s later: the exact limit admits 3,
	// then 1 (2 tokens refilled); the fleet admitted all 6.
	for range 5 {
		recs = append(recs, record(0, 0, true))
	}
	recs = append(recs, record(0, 2*time.Second, true))
	// Key 1: 2 requests, within the limit; the fleet refused one.
	recs = append(recs, record(1, time.Second, false), record(1, 0, true))
	// Key 2: 4 at once: the exact limit admits 3, the fleet admitted 2.
	for i := range 4 {
		recs = append(recs, record(2, time.Millisecond, i < 2))
	}
	slices.Reverse(recs)
	acc := replay(recs, p, time.Unix(1000, 0), 3*time.Second, 1)
	want := accuracy{requests: 12, admitted: 9, exact: 9, keys: 3, overMax: 2, overKeys: 1, overSum: 2,
		within: 2, refusedWithin: 1, under: 2, load: [3]int64{2, 10, 0}}
	if acc != want {
		t.Errorf("replay: %+v\nwant %+v", acc, want)
	}
}

// TestParseRedis: regions by name or by position, a Cluster by its
// prefix or its several seeds.
func TestParseRedis(t *testing.T) {
	got, err := parseRedis("eu=127.0.0.1:7000; us=127.0.0.1:7001;ap=cluster:127.0.0.1:7002,127.0.0.1:7003")
	if err != nil {
		t.Fatal(err)
	}
	want := []region{{"eu", []string{"127.0.0.1:7000"}, false}, {"us", []string{"127.0.0.1:7001"}, false},
		{"ap", []string{"127.0.0.1:7002", "127.0.0.1:7003"}, true}}
	if !slices.EqualFunc(got, want, sameRegion) {
		t.Errorf("got %v, want %v", got, want)
	}
	got, err = parseRedis("127.0.0.1:1,127.0.0.1:2;cluster:127.0.0.1:3")
	want = []region{{"r1", []string{"127.0.0.1:1", "127.0.0.1:2"}, true}, {"r2", []string{"127.0.0.1:3"}, true}}
	if err != nil || !slices.EqualFunc(got, want, sameRegion) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", "eu=", "eu=127.0.0.1:1;eu=127.0.0.1:2", "EU=127.0.0.1:1", "eu=localhost"} {
		if _, err := parseRedis(bad); err == nil {
			t.Errorf("parseRedis(%q): no error", bad)
		}
	}
}

func sameRegion(a, b region) bool {
	return a.name == b.name && a.cluster == b.cluster && slices.Equal(a.addrs, b.addrs)
}

// TestParseClusterNodes: every node that serves, master or replica,
// without its bus port or hostname.
func TestParseClusterNodes(t *testing.T) {
	text := "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n" +
		"b2 127.0.0.1:7001@17001,host.example master - 0 1 2 connected 5461-10922\n" +
		"c3 127.0.0.1:7003@17003 slave a1 0 1 1 connected\n" +
		"d4 127.0.0.1:7004@17004 master,fail - 0 1 3 disconnected\n" +
		"e5 :0@0 master,noaddr - 0 1 3 disconnected\n"
	got := parseClusterNodes(text)
	want := []node{{addr: "127.0.0.1:7000", master: true}, {addr: "127.0.0.1:7001", master: true}, {addr: "127.0.0.1:7003"}}
	if !slices.EqualFunc(got, want, func(a, b node) bool { return a.addr == b.addr && a.master == b.master }) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// TestParseInfo: INFO's fields, sections and blank lines skipped.
func TestParseInfo(t *testing.T) {
	m := parseInfo("# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.25\r\n\r\n# Memory\r\nused_memory:1024\r\n")
	if got := m.float("used_cpu_sys") + m.float("used_cpu_user"); got != 3.75 {
		t.Errorf("cpu %g, want 3.75", got)
	}
	if m.float("used_memory") != 1024 || m.float("mem_clients_normal") != 0 {
		t.Errorf("memory fields %v", m)
	}
}

// TestSyncBound: the bound as limiter/fleetsync's doc states it.
func TestSyncBound(t *testing.T) {
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 50}
	// refill 10; 10 + (50 + 10) × 9/10 = 64.
	if got := syncBound(p, 100*time.Millisecond, 10); got != 64 {
		t.Errorf("syncBound %d, want 64", got)
	}
	if got := syncBound(p, 100*time.Millisecond, 1); got != 10 {
		t.Errorf("syncBound of one instance %d, want 10", got)
	}
}
