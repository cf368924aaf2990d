package fleetsync_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// syncFleet is n Limiters on one Redis under one prefix (o's, else one
// of their own): n instances.
func syncFleet(t *testing.T, o limiter.RedisOptions, n int, ev ...limiter.SyncEvents) []*limiter.Limiter {
	t.Helper()
	o.KeyPrefix, o.Timeout = cmp.Or(o.KeyPrefix, fmt.Sprintf("sync%x:", rand.Uint64())), 2*time.Second
	var fleet []*limiter.Limiter
	for i := range n {
		c := limiter.Config{Redis: &o}
		if i < len(ev) {
			c.Sync = ev[i]
		}
		l, err := limiter.New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		fleet = append(fleet, l)
	}
	return fleet
}

// registerAll starts the rounds of fleet, as their first requests do (a
// request of a zone that syncs every interval, costing nothing), and waits
// until each is warm (registered twice) and counts the others.
func registerAll(fleet []*limiter.Limiter, interval time.Duration) {
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Second, Burst: 1}
	start := limiter.Request{Zone: "start", Key: "start", Policy: p, Sync: interval}.WithDigest(nil)
	for _, l := range fleet {
		l.CountSync(context.Background(), interval)
		var v limiter.Verdict
		l.Decide(context.Background(), time.Time{}, []limiter.Request{start}, limiter.Caller{}, &v)
		v.Release()
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ready := true
		for _, l := range fleet {
			ready = ready && l.SyncReady() && l.Instances() == len(fleet)
		}
		if ready {
			return
		}
	}
	panic("the syncers did not warm up in 10s") // a test's goroutine may call it: no t.Fatal
}

// decider decides requests as a Limiter does: a Limiter, or an instance
// of a storage fleet (instance_test.go).
type decider interface {
	Decide(ctx context.Context, now time.Time, reqs []limiter.Request, c limiter.Caller, v *limiter.Verdict)
}

// floodSync sends requests of one key as fast as it can through every
// instance of fleet for d, and counts those admitted.
func floodSync[L decider](fleet []L, req limiter.Request, d time.Duration) (admitted, sent int64, took time.Duration) {
	var a, s atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, l := range fleet {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var v limiter.Verdict
				for time.Since(start) < d {
					l.Decide(context.Background(), time.Time{}, []limiter.Request{req}, limiter.Caller{Fallback: limiter.Fallback{Mode: limiter.FallbackDeny}}, &v)
					s.Add(1)
					if v.States[0] == limiter.Allowed {
						a.Add(1)
					}
					v.Release()
				}
			}()
		}
	}
	wg.Wait()
	return a.Load(), s.Load(), time.Since(start)
}

// TestSyncOvershootBounded: three instances syncing a zone of 100r/s,
// burst 100, flooded through all three: the fleet admits at most what the
// exact limit admits over the period and one interval more, plus
// (N-1)/N of the burst and of an interval's refill; and most of what it
// may.
var floodFor = 1500 * time.Millisecond

func TestSyncOvershootBounded(t *testing.T) {
	c := limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}}
	for _, interval := range []time.Duration{100 * time.Millisecond, time.Second} {
		t.Run(interval.String(), func(t *testing.T) {
			fleet := syncFleet(t, c, 3)
			registerAll(fleet, interval)
			p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 100}
			req := limiter.Request{Zone: "api", Key: "flood", Policy: p, Cost: 1, Sync: interval}.WithDigest(nil)
			admitted, sent, took := floodSync(fleet, req, floodFor)
			exact := 100 + 100*took.Seconds()
			bound := exact + 100*interval.Seconds() + 2.0/3*(100+100*interval.Seconds())
			t.Logf("sync %s: %d of %d admitted in %s; exact %.0f, bound %.0f; %d instances seen", interval, admitted, sent, took, exact, bound, fleet[0].Instances())
			if float64(admitted) > bound {
				t.Fatalf("%d admitted, over the bound %.0f", admitted, bound)
			}
			if float64(admitted) < 0.8*exact {
				t.Fatalf("%d admitted, under 80%% of the exact %.0f", admitted, exact)
			}
		})
	}
}

// TestSyncCostOverShare: a cost more than an instance's share (a burst of
// 20 over 3 instances, a cost of 10) is decided in Redis, exactly: the
// bucket's two such requests pass, then none.
func TestSyncCostOverShare(t *testing.T) {
	c := limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}}
	fleet := syncFleet(t, c, 3)
	registerAll(fleet, 100*time.Millisecond)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 20, Period: time.Hour, Burst: 20}
	req := limiter.Request{Zone: "api", Key: "big", Policy: p, Cost: 10, Sync: 100 * time.Millisecond}.WithDigest(nil)
	admitted, _, _ := floodSync(fleet, req, 500*time.Millisecond)
	if admitted != 2 {
		t.Fatalf("%d requests of cost 10 admitted from a burst of 20, want 2", admitted)
	}
}

// TestSyncRestartReadsRedis: an instance that stops charges what it
// admitted, and one that starts reads a bucket in Redis before it admits
// from it: a bucket spent before a restart stays spent.
func TestSyncRestartReadsRedis(t *testing.T) {
	c := limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}}
	prefix := fmt.Sprintf("sync%x:", rand.Uint64())
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 10, Period: time.Hour, Burst: 10}
	req := limiter.Request{Zone: "api", Key: "k", Policy: p, Cost: 1, Sync: time.Second}.WithDigest(nil)
	c.KeyPrefix, c.Timeout = prefix, 2*time.Second
	first, err := limiter.New(limiter.Config{Redis: &c})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	registerAll([]*limiter.Limiter{first}, time.Second)
	if admitted, _, _ := floodSync([]*limiter.Limiter{first}, req, 300*time.Millisecond); admitted != 10 {
		t.Fatalf("one instance admitted %d of a burst of 10", admitted)
	}
	first.Close() // a restart: what it admitted is charged as it stops
	second, err := limiter.New(limiter.Config{Redis: &c})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if admitted, _, _ := floodSync([]*limiter.Limiter{second}, req, 300*time.Millisecond); admitted != 0 {
		t.Fatalf("after the restart, %d admitted from a bucket spent before it", admitted)
	}
}

// TestSyncWindowsBounded: three instances syncing a window of 100 a
// second, flooded through all three for two seconds (the window turns
// twice or three times): the fleet admits at most the exact count of the
// windows the flood touched, plus (N-1)/N of a window's limit and an
// interval's share of it; and most of what the exact limit admits.
func TestSyncWindowsBounded(t *testing.T) {
	c := limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}}
	const interval = 100 * time.Millisecond
	for _, algo := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		t.Run(algo.String(), func(t *testing.T) {
			fleet := syncFleet(t, c, 3)
			registerAll(fleet, interval)
			floodWindows(t, fleet, algo, interval, interval)
		})
	}
}

// floodWindows floods fleet (three instances syncing every sync) with a
// window of algo of 100 a second for two seconds (the window turns twice
// or three times), and checks the fleet admitted at most the exact count
// of the windows the flood touched plus the bound of a sync of lag, and
// most of what the exact limit admits.
func floodWindows[L decider](t *testing.T, fleet []L, algo limiter.Algorithm, sync, lag time.Duration) {
	t.Helper()
	p := limiter.Policy{Algorithm: algo, Rate: 100, Period: time.Second, Burst: 100}
	req := limiter.Request{Zone: "api", Key: "flood", Policy: p, Cost: 1, Sync: sync}.WithDigest(nil)
	start := time.Now()
	admitted, sent, took := floodSync(fleet, req, 2*time.Second)
	windows := float64(start.Add(took).Truncate(time.Second).Sub(start.Truncate(time.Second))/time.Second + 1)
	exact := 100 * windows // the fixed window's; the sliding counter's is below it
	bound := exact + 100*lag.Seconds() + 2.0/3*(100+100*lag.Seconds())
	t.Logf("%s: %d of %d admitted in %s; exact at most %.0f, bound %.0f", algo, admitted, sent, took, exact, bound)
	if float64(admitted) > bound {
		t.Fatalf("%d admitted, over the bound %.0f", admitted, bound)
	}
	if admitted < 150 {
		t.Fatalf("%d admitted in two seconds of 100 a second", admitted)
	}
}

// syncRounds counts a Syncer's rounds by outcome, keeping the first error,
// and the instances last told.
type syncRounds struct {
	ok, failed atomic.Int64
	first      atomic.Pointer[error]
	instances  atomic.Int64
}

func (r *syncRounds) InstancesChanged(n int) { r.instances.Store(int64(n)) }

func (r *syncRounds) Synced(_ int, _ time.Duration, err error) {
	if err == nil {
		r.ok.Add(1)
		return
	}
	r.failed.Add(1)
	r.first.CompareAndSwap(nil, &err)
}

// TestSyncManyKeysCluster: three instances on the Cluster, a zone of each
// algorithm that syncs, 1,500 client keys (every master's slots): a round
// charges the buckets of many slots, and every round succeeds (a call
// that declares keys of several slots fails with CROSSSLOT).
func TestSyncManyKeysCluster(t *testing.T) {
	c := limiter.RedisOptions{Addresses: redistest.ClusterAddrs(t)}
	const interval = 100 * time.Millisecond
	rounds := []*syncRounds{{}, {}, {}}
	fleet := syncFleet(t, c, 3, rounds[0], rounds[1], rounds[2])
	registerAll(fleet, interval)
	var v limiter.Verdict
	for k := range 1500 {
		for _, algo := range []limiter.Algorithm{limiter.TokenBucket, limiter.FixedWindow, limiter.SlidingWindowCounter} {
			p := limiter.Policy{Algorithm: algo, Rate: 4, Period: time.Second, Burst: 4} // a share of 1: the second request is charged
			req := limiter.Request{Zone: "many", Key: fmt.Sprintf("client-%d", k), Policy: p, Cost: 1, Sync: interval}.WithDigest(nil)
			for _, l := range fleet { // seeded by the first, spent by the rounds' charges after
				for range 2 {
					l.Decide(context.Background(), time.Time{}, []limiter.Request{req}, limiter.Caller{Fallback: limiter.Fallback{Mode: limiter.FallbackDeny}}, &v)
					v.Release()
				}
			}
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(interval)
	}
	for i, r := range rounds {
		if r.failed.Load() > 0 {
			t.Fatalf("instance %d: %d of %d rounds failed, first: %v", i, r.failed.Load(), r.failed.Load()+r.ok.Load(), *r.first.Load())
		}
		if r.ok.Load() == 0 {
			t.Fatalf("instance %d: no round ran", i)
		}
	}
}

// TestSyncWindowsPaced: three instances syncing a window of 100 every two
// seconds (every second, half the window), sent 1.5 and 10 times the
// limit round-robin for six windows: over the whole run the fleet admits
// at most the exact limit of the windows it touched plus the stated bound
// (what went over in one window is taken off the next, as a token
// bucket's debt is), and at least half of the full windows' limit.
func TestSyncWindowsPaced(t *testing.T) {
	c := limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}}
	const interval, window, limit = 100 * time.Millisecond, time.Second, 100
	for _, algo := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		for _, times := range []int{15, 100} { // tenths of the limit
			t.Run(fmt.Sprintf("%s/%d.%dx", algo, times/10, times%10), func(t *testing.T) {
				t.Parallel()
				fleet := syncFleet(t, c, 3)
				registerAll(fleet, interval)
				p := limiter.Policy{Algorithm: algo, Rate: limit, Period: window, Burst: limit}
				req := limiter.Request{Zone: "paced", Key: "k", Policy: p, Cost: 1, Sync: interval}.WithDigest(nil)
				start := time.Now()
				admitted, sent := pacedSync(fleet, req, int(float64(limit*times/10)/window.Seconds()), 12*window)
				windows := float64(time.Now().Truncate(window).Sub(start.Truncate(window))/window + 1)
				exact := limit * windows
				refill := limit * interval.Seconds() / window.Seconds()
				bound := exact + refill + 2.0/3*(limit+refill) // syncBound's formula
				t.Logf("%d of %d admitted over %.0f windows; exact at most %.0f, bound %.0f", admitted, sent, windows, exact, bound)
				if float64(admitted) > bound {
					t.Fatalf("%d admitted, over the bound %.0f", admitted, bound)
				}
				if float64(admitted) < 0.5*(exact-2*limit) {
					t.Fatalf("%d admitted, under half the %.0f of the full windows", admitted, exact-2*limit)
				}
			})
		}
	}
}

// pacedSync sends requests of one key through the instances of fleet in
// turn, perSecond of them each second, for d; it counts those admitted.
func pacedSync[L decider](fleet []L, req limiter.Request, perSecond int, d time.Duration) (admitted, sent int) {
	every := time.Second / time.Duration(perSecond)
	start := time.Now()
	var v limiter.Verdict
	for i := 0; time.Since(start) < d; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * every)); wait > 0 {
			time.Sleep(wait)
		}
		fleet[i%len(fleet)].Decide(context.Background(), time.Time{}, []limiter.Request{req}, limiter.Caller{Fallback: limiter.Fallback{Mode: limiter.FallbackDeny}}, &v)
		sent++
		if v.States[0] == limiter.Allowed {
			admitted++
		}
		v.Release()
	}
	return admitted, sent
}

// TestSyncFleetStartsTogether: three instances whose configs load one
// after the other (the first counts itself alone then), sent 1,800
// requests a second round-robin at once: none hands out a share of a
// fleet smaller than the one that is there, so the fleet admits at most
// the exact limit and the bound of three instances (a burst of 600 and a
// rate of 1/s, where a share of one instance is the whole burst: 599 +
// 299 + 199 admitted before the first round, against a bound of 1,003).
func TestSyncFleetStartsTogether(t *testing.T) {
	c := limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}}
	const interval = time.Second
	fleet := syncFleet(t, c, 3)
	for _, l := range fleet { // as each config loads
		l.CountSync(context.Background(), interval)
	}
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Second, Burst: 600}
	req := limiter.Request{Zone: "start", Key: "k", Policy: p, Cost: 1, Sync: interval}.WithDigest(nil)
	start := time.Now()
	admitted, sent := pacedSync(fleet, req, 1800, 1500*time.Millisecond)
	took := time.Since(start)
	exact := 600 + took.Seconds()
	bound := exact + interval.Seconds() + 2.0/3*(600+interval.Seconds())
	t.Logf("%d of %d admitted in %s; exact %.0f, bound %.0f", admitted, sent, took, exact, bound)
	if float64(admitted) > bound {
		t.Fatalf("%d admitted by a fleet starting together, over the bound %.0f", admitted, bound)
	}
}
