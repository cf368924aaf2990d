package fleetsync_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// The accuracy of zones that sync in both directions: a fleet of real
// instances (each with its own Redis clients, as separate Caddys have) is
// sent arrivals of many clients, each request to an instance at random,
// and each decision is compared with an exact replay of the same arrivals,
// in the same order and at the times the fleet decided them (Redis's
// clock, for the requests it decided in Redis), against one bucket of the
// zone's whole burst and rate. For every client, the fleet admits at most
// the replay's admissions plus the bound (rate × sync + (N − 1) / N ×
// (burst + rate × sync), rounded up); added up over the clients, it admits
// short of the replay at most 1% of the requests (measured: 0.04% to
// 0.3%). What remains short is the charge of what an instance admitted
// from its allowance, made at the next round on Redis's clock: a bucket
// that was full when a request was admitted but is charged an interval
// later refills that much later, up to rate × sync tokens short until it
// is full again.

// arrival is a request of client at offset from the run's start.
type arrival struct {
	at     time.Duration
	client int
}

// poissonArrivals are the arrivals of clients each sending at perSecond on
// average, with exponential gaps, over d, merged in time order.
func poissonArrivals(rng *rand.Rand, clients int, perSecond float64, d time.Duration) []arrival {
	var out []arrival
	for c := range clients {
		at := time.Duration(rng.ExpFloat64() / perSecond * float64(time.Second))
		for ; at < d; at += time.Duration(rng.ExpFloat64() / perSecond * float64(time.Second)) {
			out = append(out, arrival{at: at, client: c})
		}
	}
	slices.SortFunc(out, func(a, b arrival) int { return int(a.at - b.at) })
	return out
}

// pacedArrivals are the arrivals of clients each sending every 1/perSecond,
// each starting at a random phase, over d, merged in time order.
func pacedArrivals(rng *rand.Rand, clients int, perSecond float64, d time.Duration) []arrival {
	gap := time.Duration(float64(time.Second) / perSecond)
	var out []arrival
	for c := range clients {
		for at := time.Duration(rng.Int64N(int64(gap))); at < d; at += gap {
			out = append(out, arrival{at: at, client: c})
		}
	}
	slices.SortFunc(out, func(a, b arrival) int { return int(a.at - b.at) })
	return out
}

// accuracy is a run's comparison with the exact replay.
type accuracy struct {
	requests, admitted, exactAdmitted int
	under                             int // the clients' admissions short of the replay's, added up
	over                              int // the largest excess of a client's admissions over the replay's
}

// replay sends arrivals to fleet (an instance at random for each) and
// the same, at the times they were decided, to one exact bucket.
func replay(t *testing.T, rng *rand.Rand, fleet []*limiter.Limiter, arrivals []arrival, p limiter.Policy, interval time.Duration) accuracy {
	t.Helper()
	return replayWith(t, rng, fleet, arrivals, p, interval, limiter.Caller{}, nil)
}

// replayWith is replay with the fleet's caller c, and event called once
// the run has gone on for at (none when nil).
func replayWith(t *testing.T, rng *rand.Rand, fleet []*limiter.Limiter, arrivals []arrival, p limiter.Policy, interval time.Duration,
	c limiter.Caller, event *runEvent) accuracy {
	t.Helper()
	exact, err := limiter.New(limiter.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer exact.Close()
	clients := 0
	for _, a := range arrivals {
		clients = max(clients, a.client+1)
	}
	synced, replayed := make([]int, clients), make([]int, clients)
	var acc accuracy
	var v limiter.Verdict
	start := time.Now()
	for _, a := range arrivals {
		time.Sleep(time.Until(start.Add(a.at)))
		if event != nil && a.at >= event.at && event.do != nil {
			event.do()
			event.do = nil
		}
		req := limiter.Request{Zone: "acc", Key: fmt.Sprint("client-", a.client), Policy: p, Cost: 1, Sync: interval}.WithDigest(nil)
		fleet[rng.IntN(len(fleet))].Decide(context.Background(), time.Time{}, []limiter.Request{req}, c, &v)
		if !v.Refused() {
			synced[a.client]++
		}
		now := time.Now() // the replay's time: the fleet's, when it decided (Redis's clock, for a call)
		if len(v.Decisions) > 0 && !v.Decisions[0].At.IsZero() {
			now = v.Decisions[0].At
		}
		v.Release()
		req.Sync = 0
		exact.Decide(context.Background(), now, []limiter.Request{req}, limiter.Caller{}, &v)
		if !v.Refused() {
			replayed[a.client]++
		}
		v.Release()
	}
	for c := range clients {
		acc.admitted += synced[c]
		acc.exactAdmitted += replayed[c]
		acc.over = max(acc.over, synced[c]-replayed[c])
		acc.under += max(replayed[c]-synced[c], 0)
	}
	acc.requests = len(arrivals)
	return acc
}

// runEvent is what happens once a run has gone on for at (do is called
// once).
type runEvent struct {
	at time.Duration
	do func()
}

// syncBound is the stated bound of a zone of p syncing every interval on
// n instances, rounded up.
func syncBound(p limiter.Policy, interval time.Duration, n int) int {
	refill := float64(p.Rate) * interval.Seconds() / p.Period.Seconds()
	return int(math.Ceil(refill + (float64(p.Burst)+refill)*float64(n-1)/float64(n)))
}

// TestSyncAccuracySmallBursts: zones of bursts 1 to 3 whose refill in one
// interval is under a token (2r/s, sync 100ms), on 2 and 3 instances,
// 200 clients at 80% of their limit (Poisson) or 90% (paced):
// refused no more than the exact replay refuses, but for 0.2% of the
// requests, and admitted within the replay plus the bound for every
// client. A share rounds down to no token here: an instance that holds
// none leaves the request to Redis, once per bucket and interval, when
// the bucket may hold it; and an instance's charge is made as of its
// last request, so that a bucket full meanwhile is not charged late.
func TestSyncAccuracySmallBursts(t *testing.T) {
	const interval, d, clients = 100 * time.Millisecond, 8 * time.Second, 200
	for _, tc := range []struct {
		name      string
		instances int
		burst     int64
		arrivals  func(*rand.Rand, int, float64, time.Duration) []arrival
		load      float64 // of the rate
	}{
		{"poisson/2 instances/burst 3", 2, 3, poissonArrivals, 0.8},
		{"paced/3 instances/burst 1", 3, 1, pacedArrivals, 0.9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 2, Period: time.Second, Burst: tc.burst}
			fleet := syncFleet(t, limiter.RedisOptions{Addresses: redistest.ClusterAddrs(t), Cluster: true}, tc.instances)
			registerAll(fleet, interval)
			rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
			acc := replay(t, rng, fleet, tc.arrivals(rng, clients, tc.load*2, d), p, interval)
			under := acc.under
			t.Logf("%d requests: admitted %d, exact replay %d (refused beyond it: %d), largest excess of one client %d",
				acc.requests, acc.admitted, acc.exactAdmitted, under, acc.over)
			// Measured: 0 to 2 in 2,500 (0.08 %); held at 0.2 %, for a
			// loaded host's timing.
			if allowed := max(acc.requests/500, 1); under > allowed {
				t.Errorf("refused %d requests beyond the exact replay (%.2f%%), want at most %d (0.2%%)",
					under, 100*float64(under)/float64(acc.requests), allowed)
			}
			if bound := syncBound(p, interval, tc.instances); acc.over > bound {
				t.Errorf("a client was admitted %d beyond the exact replay, want at most the bound %d", acc.over, bound)
			}
		})
	}
}

// TestSyncAccuracyQuota: a day's quota of 30 that syncs every 100ms on 3
// instances, 150 clients sending 6 a second for 6 seconds (Poisson), most
// of them past their quota: each is admitted within the exact replay plus
// the bound, and refused beyond it at most 0.2% of the requests (an
// instance whose share is spent leaves a request to Redis while the
// period's count may hold it). Redis's reply gives the count, so that the
// rounds read what the fleet used of the period.
func TestSyncAccuracyQuota(t *testing.T) {
	const interval, d, clients, instances = 100 * time.Millisecond, 6 * time.Second, 150, 3
	p := limiter.Policy{Algorithm: limiter.Quota, Rate: 30, Burst: 30, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	if _, end := p.Calendar.Bounds(time.Now()); time.Until(end) < 2*d {
		t.Skip("midnight UTC would come during the run")
	}
	fleet := syncFleet(t, limiter.RedisOptions{Addresses: redistest.ClusterAddrs(t), Cluster: true}, instances)
	registerAll(fleet, interval)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
	acc := replay(t, rng, fleet, poissonArrivals(rng, clients, 6, d), p, interval)
	t.Logf("%d requests: admitted %d, exact replay %d (refused beyond it: %d), largest excess of one client %d",
		acc.requests, acc.admitted, acc.exactAdmitted, acc.under, acc.over)
	if allowed := max(acc.requests/500, 1); acc.under > allowed {
		t.Errorf("refused %d requests beyond the exact replay, want at most %d (0.2%%)", acc.under, allowed)
	}
	if bound := syncBound(p, interval, instances); acc.over > bound {
		t.Errorf("a client was admitted %d beyond the exact replay, want at most the bound %d", acc.over, bound)
	}
	if acc.admitted < acc.exactAdmitted {
		t.Errorf("admitted %d, fewer than the exact replay's %d", acc.admitted, acc.exactAdmitted)
	}
}
