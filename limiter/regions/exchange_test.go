package regions

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestBound: the package doc's example, and no bound for one region.
func TestBound(t *testing.T) {
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1000, Period: time.Minute, Burst: 1000}
	if got := Bound(p, 3, time.Second, time.Second); math.Abs(got-(2*334+2*1000.0/60*2)) > 1e-9 {
		t.Errorf("Bound of 1000r/m, burst 1000, 3 regions, 1s + 1s = %v; want 2 × 334 + 2 × 16.7 × 2", got)
	}
	if got := Bound(p, 1, time.Second, time.Second); got != 0 {
		t.Errorf("Bound of one region = %v; want 0", got)
	}
}

// TestPolicyShare: a region decides with ⌈burst/R⌉ and the rate of the
// regions counted, alone until it has counted the others; other
// algorithms are left alone.
func TestPolicyShare(t *testing.T) {
	x := New(Config{This: "eu", Peers: map[string]Peer{"us": nil, "ap": nil}, Interval: time.Second, Timeout: time.Second})
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 100, Period: time.Second, Burst: 10}
	if got := x.Policy(p); got.Period != 3*time.Second || got.Burst != 4 {
		t.Errorf("new, no peer told or heard: %+v; want period 3s (a third of the rate), burst 4", got)
	}
	x.counted.Store(3)
	if got := x.Policy(p); got.Burst != 4 || got.Period != time.Second || got.Rate != 100 {
		t.Errorf("every region counted: %+v; want burst 4, the rate unchanged", got)
	}
	x.counted.Store(2)
	if got := x.Policy(p); got.Period != 1500*time.Millisecond {
		t.Errorf("two regions counted: period %s; want 1.5s (2/3 of the rate)", got.Period)
	}
	x.counted.Store(1)
	if got := x.Policy(p); got.Period != 3*time.Second || got.Burst != 4 {
		t.Errorf("cut off: %+v; want period 3s (a third of the rate), burst 4", got)
	}
	w := bucket.Policy{Algorithm: bucket.FixedWindow, Rate: 10, Period: time.Second, Burst: 10}
	if got := x.Policy(w); got != w {
		t.Errorf("a fixed window: %+v; want it unchanged", got)
	}
}

// TestRecord: Record counts what global zones admitted, by bucket, with
// the share of the burst a peer decides by; not in dry run, or of a zone
// that is not global.
func TestRecord(t *testing.T) {
	x := New(Config{This: "eu", Peers: map[string]Peer{"us": nil}, Interval: time.Second, Timeout: time.Second})
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 100, Period: time.Second, Burst: 10}
	reqs := []bucket.Request{
		{Zone: "z", Key: "a", Policy: p, Cost: 2, Global: true},
		{Zone: "z", Key: "a", Policy: p, Cost: 3, Global: true},
		{Zone: "z", Key: "b", Policy: p, Cost: 1, Global: true},               // refused: not recorded
		{Zone: "z", Key: "c", Policy: p, Cost: 1, Global: true, DryRun: true}, // dry run
		{Zone: "n", Key: "a", Policy: p, Cost: 1},                             // not global
	}
	for i := range reqs {
		if i != 2 { // refused: not recorded
			x.Record(&reqs[i])
		}
	}
	if len(x.pending) != 1 {
		t.Fatalf("pending %v; want key a alone", x.pending)
	}
	c, ok := x.pending[bucket.IDOf(reqs[0])]
	if !ok || c.cost != 5 || c.p.Burst != 5 {
		t.Fatalf("key a counted %+v; want 5, with burst 5 (the share of 10 among 2)", c)
	}
}

// TestRecordPeriod: a quota's admissions are counted by the period they
// counted in: those of a later period replace the count (the earlier
// period's count went with it), those of an earlier one, late, are
// dropped; a refusal's level is the count. A bucket in doubt of an
// earlier period is charged anew, in the later period's own epoch.
func TestRecordPeriod(t *testing.T) {
	x := New(Config{This: "eu", Peers: map[string]Peer{"us": nil}, Interval: time.Second, Timeout: time.Second})
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 100, Burst: 100, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	r := bucket.Request{Zone: "q", Key: "a", Policy: p, Cost: 2, Global: true}
	x.RecordPeriod(&r, day)
	x.RecordPeriod(&r, day.Add(24*time.Hour))
	x.RecordPeriod(&r, day) // late: of the period before
	x.Refused(&r, p, bucket.Decision{Used: 40, At: day, Reset: day.Add(24 * time.Hour)}, day)
	c := x.pending[bucket.IDOf(r)]
	if c.cost != 2 || c.period != day.Add(24*time.Hour).UnixMicro() || c.empty != 40 {
		t.Fatalf("counted %+v; want 2 of the second day, level 40", c)
	}
	s := x.peers[0]
	id := bucket.IDOf(r)
	s.doubts[id] = doubt{p: c.p, epoch: 1, total: 7, period: day.UnixMicro()}
	s.backlog[id] = c
	reqs, all := s.take(day, 2)
	if len(reqs) != 1 || reqs[0].Cost != 2 || all[0].d.epoch != 2 || all[0].d.period != c.period {
		t.Fatalf("charged %+v (%+v); want 2, in epoch 2, of the second day", reqs, all)
	}
	if got := s.withLevels(reqs, all, []int{0})[0].ID; got != fmt.Sprintf("n:%s:2:40@%d", x.id, c.period) {
		t.Errorf("the charge's id %q; want its level and its period's end", got)
	}
}

// TestHealth: a link degrades at the third failure among its last ten
// exchanges, stays degraded while any of the last ten failed, and heals
// after ten successes in a row; each change is reported once.
func TestHealth(t *testing.T) {
	var h health
	changes := 0
	run := func(results string) {
		for _, r := range results {
			if h.add(r == 'x') {
				changes++
			}
		}
	}
	run("x...x....") // two failures in nine
	if h.degraded || changes != 0 {
		t.Fatalf("two failures: degraded %v, %d changes; want healthy", h.degraded, changes)
	}
	run("x")
	if !h.degraded || changes != 1 {
		t.Fatalf("three failures in ten: degraded %v, %d changes; want degraded, once", h.degraded, changes)
	}
	if err := h.err(errors.New("a\nb")); !errors.Is(err, ErrDegraded) || strings.Contains(err.Error(), "\n") {
		t.Errorf("err = %q; want ErrDegraded, on one line", err)
	}
	run(".........")
	if !h.degraded {
		t.Fatal("nine successes after a failure: healed; want degraded until ten")
	}
	run(".")
	if h.degraded || changes != 2 {
		t.Fatalf("ten successes in a row: degraded %v, %d changes; want healed, reported once", h.degraded, changes)
	}
}

// TestFingerprintDiffers: what differs is named, zone by zone; a mark
// that is not a fingerprint (another version, a hostile writer, too long)
// differs; peers' zone names are quoted.
func TestFingerprintDiffers(t *testing.T) {
	f := Fingerprint{Secret: "s", Zones: map[string]ZoneFingerprint{"api": {Key: "k", Limit: "l"}, "login": {Key: "k", Limit: "l"}}}
	if d := f.differs(f.Mark()); d != "" {
		t.Errorf("itself: %q; want nothing", d)
	}
	o := Fingerprint{Secret: "t", Zones: map[string]ZoneFingerprint{"api": {Key: "k2", Limit: "l2"}, "new\nzone": {Key: "k", Limit: "l"}}}
	want := `key_secret; zone "api"'s key; zone "api"'s algorithm, rate or burst; zone "login" is global here, not there; zone "new\nzone" is global there, not here`
	if d := f.differs(o.Mark()); d != want {
		t.Errorf("differs:\n%s\nwant\n%s", d, want)
	}
	for _, mark := range []string{"1", `{"v":2,"s":"s"}`, f.Mark() + strings.Repeat(" ", maxMark)} {
		if d := f.differs(mark); !strings.Contains(d, "no fingerprint") {
			t.Errorf("mark %.20q: %q; want it unreadable", mark, d)
		}
	}
}

// TestPendingMemory: a bucket counted since the last interval takes at
// most 120 bytes (its ID, its count and the map's share), its policy kept
// once for all; maxBacklog of them at most.
func TestPendingMemory(t *testing.T) {
	x := New(Config{This: "eu", Peers: map[string]Peer{"us": nil}, Interval: time.Second, Timeout: time.Second})
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 100, Period: time.Second, Burst: 10}
	const n = 200000
	reqs := make([]bucket.Request, n)
	for i := range reqs {
		reqs[i] = bucket.Request{Zone: "api", Key: strconv.Itoa(i), Policy: p, Cost: 1, Global: true}
	}
	before := heapAlloc()
	for i := range reqs {
		x.Record(&reqs[i])
	}
	perKey := float64(heapAlloc()-before) / n
	t.Logf("%.0f bytes per bucket counted; %d policies kept", perKey, len(x.policies))
	if perKey > 120 || len(x.policies) != 1 {
		t.Errorf("%.0f bytes per bucket counted, %d policies kept; want at most 120, and one policy", perKey, len(x.policies))
	}
	runtime.KeepAlive(reqs)
}

// heapAlloc is the live heap after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestFloodAtOnce: the first count an instance cannot keep makes it
// decide alone at once, not at the next count.
func TestFloodAtOnce(t *testing.T) {
	x := New(Config{This: "eu", Peers: map[string]Peer{"us": nil}, Interval: time.Second, Timeout: time.Second})
	x.counted.Store(2)
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Minute, Burst: 10}
	for i := range maxBacklog {
		x.Record(&bucket.Request{Zone: "api", Key: strconv.Itoa(i), Policy: p, Cost: 1, Global: true})
	}
	if x.Counted() != 2 {
		t.Fatalf("%d regions counted with pending full; want 2 still", x.Counted())
	}
	x.Record(&bucket.Request{Zone: "api", Key: "one more", Policy: p, Cost: 1, Global: true})
	if x.Counted() != 1 || !x.flooding() {
		t.Errorf("a count dropped: %d regions counted, flooding %v; want this one alone, flooding", x.Counted(), x.flooding())
	}
}

// TestExchangePhases: instances started together (a fleet's rollout, a
// reload sent to all) exchange at phases of their own, spread over the
// interval, not all at the same instant: a peer's Redis runs every
// instance's charges at once otherwise, and the requests of that region
// wait behind them (fleetsim, 5 regions at 2,500 decisions/s: p99 77 ms
// in step, 17.5 ms at random phases).
func TestExchangePhases(t *testing.T) {
	const n, d = 32, time.Second
	lo, hi := d, time.Duration(-1)
	for range n {
		x := New(Config{This: "eu", Peers: map[string]Peer{"us": nil}, Interval: d, Timeout: time.Second})
		if x.phase < 0 || x.phase >= d {
			t.Fatalf("phase %s out of [0, %s)", x.phase, d)
		}
		lo, hi = min(lo, x.phase), max(hi, x.phase)
	}
	if hi-lo < d/4 { // 32 uniform draws within a quarter: about 1e-17
		t.Fatalf("%d exchanges' phases within %s of each other; want them spread over the interval", n, hi-lo)
	}
}
