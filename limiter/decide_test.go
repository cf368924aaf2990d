package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// TestDecideDryRun: dry-run zones are decided and charged apart, never
// refuse (WouldRefuse), and do not hold back the enforced zones; the
// verdict is the same whatever the order of the zones.
func TestDecideDryRun(t *testing.T) {
	one := Policy{Algorithm: TokenBucket, Rate: 1, Period: time.Hour, Burst: 1}
	two := Policy{Algorithm: TokenBucket, Rate: 2, Period: time.Hour, Burst: 2}
	for name, dryFirst := range map[string]bool{"dry last": false, "dry first": true} {
		t.Run(name, func(t *testing.T) {
			l := mustNew(t, Config{})
			defer l.Close()
			enforced := Request{Zone: "enforced", Key: "k", Policy: two, Cost: 1}
			dry := Request{Zone: "dry", Key: "k", Policy: one, Cost: 1, DryRun: true}
			reqs, ie, id := []Request{enforced, dry}, 0, 1
			if dryFirst {
				reqs, ie, id = []Request{dry, enforced}, 1, 0
			}
			now := time.Unix(1e9, 0)
			want := [][2]State{{Allowed, Allowed}, {Allowed, WouldRefuse}, {Refused, WouldRefuse}}
			for i, w := range want {
				var v Verdict
				l.Decide(t.Context(), now, reqs, Caller{Events: quietEvents{}}, &v)
				if got := [2]State{v.States[ie], v.States[id]}; got != w {
					t.Fatalf("request %d: enforced, dry %v; want %v", i+1, got, w)
				}
				if v.Refused() != (w[0] == Refused) || v.Shown(false) != ie || v.Shown(true) != id {
					t.Fatalf("request %d: refused %v, shown %d, dry shown %d", i+1, v.Refused(), v.Shown(false), v.Shown(true))
				}
				v.Release()
			}
		})
	}
}

// countingEvents count the failures and recoveries a Limiter reports.
type countingEvents struct {
	quietEvents
	mu                 sync.Mutex
	failing, recovered int
}

func (e *countingEvents) StoreFailing(error) { e.mu.Lock(); e.failing++; e.mu.Unlock() }
func (e *countingEvents) StoreRecovered(string) {
	e.mu.Lock()
	e.recovered++
	e.mu.Unlock()
}

// TestFailureReportedOncePerNode: while one cluster master does not
// answer and the others do, its failure is reported once, and its
// recovery once, whatever the requests of the other masters do in
// between (they must not flip a store-wide flag back and forth). The
// others keep serving: cluster-require-full-coverage no, as an operator
// sets it (else they answer CLUSTERDOWN, and each is reported once too).
func TestFailureReportedOncePerNode(t *testing.T) {
	cl := redistest.NewClusterOf(t, 3, 0, "--cluster-require-full-coverage", "no")
	// A timeout of 500 ms: a loaded machine can keep a healthy master's
	// reply 50 ms, and a breaker opened then is a second failure to report.
	l, err := New(Config{Redis: &RedisOptions{Addresses: cl.Addrs(), Cluster: true, KeyPrefix: "once:", Timeout: 500 * time.Millisecond}, Nodes: quietEvents{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ev := &countingEvents{}
	p := Policy{Algorithm: TokenBucket, Rate: 1000, Period: time.Second, Burst: 1000}
	decide := func(key string) {
		var v Verdict
		l.Decide(t.Context(), time.Time{}, []Request{{Zone: "z", Key: key, Policy: p, Cost: 1}}, Caller{Events: ev}, &v)
		v.Release()
	}
	for i := range 30 { // every node answers, slot maps known
		decide(fmt.Sprint("k", i))
	}
	paused := cl.Server(l.Node(t.Context(), Request{Zone: "z", Key: "k0", Policy: p}))
	paused.Pause()
	for round := range 4 {
		for i := range 30 {
			decide(fmt.Sprint("k", i))
		}
		if round == 1 {
			time.Sleep(2100 * time.Millisecond) // a breaker's cooldown: probes fail again
		}
	}
	paused.Resume()
	time.Sleep(2100 * time.Millisecond)
	for range 3 {
		for i := range 30 {
			decide(fmt.Sprint("k", i))
		}
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.failing != 1 || ev.recovered != 1 {
		t.Fatalf("one master paused, then back: %d failures and %d recoveries reported; want 1 and 1", ev.failing, ev.recovered)
	}
}

// TestDecideNoEvents: a caller without Events (a program using the
// package, not Caddy) is told nothing when Redis fails: its fallback
// decides, and Decide does not crash. Before, the failure report
// dereferenced the nil Events.
func TestDecideNoEvents(t *testing.T) {
	srv := redistest.NewServer(t)
	l := mustNew(t, Config{Redis: &RedisOptions{Addresses: []string{srv.Addr}, KeyPrefix: "noevents:", Timeout: 200 * time.Millisecond}})
	defer l.Close()
	srv.Kill()
	p := Policy{Algorithm: TokenBucket, Rate: 1, Period: time.Hour, Burst: 1}
	for i, want := range []State{Allowed, Refused} {
		var v Verdict
		l.Decide(t.Context(), time.Time{}, []Request{{Zone: "z", Key: "k", Policy: p, Cost: 1}}, Caller{}, &v)
		if v.States[0] != want || v.Calls[0].Failure == NoFailure {
			t.Errorf("request %d, Redis down, no Events: %v, failure %v; want %v by the local fallback", i, v.States[0], v.Calls[0].Failure, want)
		}
		v.Release()
	}
}

// TestBlockedRequest: a blocked request is refused with the block's time
// left, nothing charged, in the enforced zones; a dry-run zone would refuse.
func TestBlockedRequest(t *testing.T) {
	l := mustNew(t, Config{})
	defer l.Close()
	now := time.Unix(1_700_000_000, 0)
	p := Policy{Algorithm: TokenBucket, Rate: 5, Period: time.Minute, Burst: 5}
	reqs := []Request{{Zone: "a", Key: "k", Policy: p, Cost: 1}, {Zone: "b", Key: "k", Policy: p, Cost: 1, Block: time.Minute}}
	var v Verdict
	l.Decide(context.Background(), now, reqs, Caller{}, &v)
	if v.States[1] != Banned || v.States[0] != NotAsked || v.Decisions[1].RetryAfter != time.Minute || v.Decisions[1].Limit != 5 {
		t.Fatalf("states %v, decisions %+v", v.States, v.Decisions)
	}
	v.Release()
	d, err := l.Peek(context.Background(), reqs[0])
	if err != nil || d.Remaining != 5 {
		t.Fatalf("zone a charged: %+v, %v", d, err)
	}
	reqs[1].DryRun = true
	l.Decide(context.Background(), now, reqs[1:], Caller{}, &v)
	if v.States[0] != WouldRefuse {
		t.Fatalf("dry-run block: state %v", v.States[0])
	}
	v.Release()
}

// TestDecideIntoReusedVerdict: a verdict reused from one request to the
// next (Reset, as the handler's scratch does) holds each zone's own
// decision, whether the memory store decided into the verdict's room (all
// enforced, all dry-run) or the zones were decided in parts (dry-run last,
// or anywhere), with more zones than the room held before and fewer; a
// verdict decided before keeps its decisions.
func TestDecideIntoReusedVerdict(t *testing.T) {
	l := mustNew(t, Config{})
	defer l.Close()
	now := time.Unix(1_700_000_000, 0)
	policy := func(burst int64) Policy {
		return Policy{Algorithm: TokenBucket, Rate: 1, Period: time.Hour, Burst: burst}
	}
	zone := func(name string, burst int64, dry bool) Request {
		return Request{Zone: name, Key: "k", Policy: policy(burst), Cost: 1, DryRun: dry}
	}
	cases := [][]Request{
		{zone("a", 2, false)},
		{zone("b", 3, false), zone("c", 4, false), zone("d", 5, false)},
		{zone("e", 6, false), zone("f", 7, true)},
		{zone("g", 8, true), zone("h", 9, false), zone("i", 10, true)},
		{zone("j", 11, true), zone("k", 12, true)},
		{zone("l", 13, false)},
	}
	var v, other Verdict
	l.Decide(t.Context(), now, []Request{zone("other", 99, false)}, Caller{}, &other)
	for round := range 2 {
		for _, reqs := range cases {
			v.Reset()
			l.Decide(t.Context(), now, reqs, Caller{}, &v)
			for i, r := range reqs {
				d := v.Decisions[i]
				if d.Limit != r.Policy.Limit() || d.Remaining != r.Policy.Limit()-1-int64(round) {
					t.Fatalf("round %d, zone %s: decision %+v; want limit %d, remaining %d", round, r.Zone, d,
						r.Policy.Limit(), r.Policy.Limit()-1-int64(round))
				}
			}
			v.Release()
		}
	}
	if d := other.Decisions[0]; d.Limit != 99 || d.Remaining != 98 {
		t.Fatalf("another verdict's decision is now %+v", d)
	}
}
