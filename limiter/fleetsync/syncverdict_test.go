package fleetsync_test

import (
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// TestSyncVerdictReused: a Verdict reused from one request to the next,
// as the handler reuses it, on zones that sync (decided into the take the
// verdict keeps) and one decided in Redis. Each request shows its own
// decisions (none of an earlier one's), a refusal in Redis gives back
// exactly what its request took from the allowances, and another
// verdict's decisions stay as they were.
func TestSyncVerdictReused(t *testing.T) {
	fleet := syncFleet(t, limiter.RedisOptions{Addresses: []string{redistest.StandaloneAddr(t)}}, 1)
	registerAll(fleet, 10*time.Second) // no round within the test
	l := fleet[0]
	policy := func(n int64) limiter.Policy {
		return limiter.Policy{Algorithm: limiter.TokenBucket, Rate: n, Burst: n, Period: time.Hour}
	}
	req := func(zone string, n int64, sync time.Duration) limiter.Request {
		return limiter.Request{Zone: zone, Key: "k", Policy: policy(n), Cost: 1, Sync: sync}.WithDigest(nil)
	}
	a, b, e := req("a", 100, 10*time.Second), req("b", 1, 10*time.Second), req("e", 1, 0)
	var v, other limiter.Verdict
	for _, r := range []limiter.Request{a, b, e} { // a's and b's entries seeded in Redis; b and e then empty
		v.Reset()
		l.Decide(t.Context(), time.Time{}, []limiter.Request{r}, limiter.Caller{}, &v)
	}
	l.Decide(t.Context(), time.Time{}, []limiter.Request{a}, limiter.Caller{}, &other)
	kept := other.Decisions[0]
	share, _, _ := l.SyncShare(a)
	decide := func(step string, reqs []limiter.Request, want []limiter.State, wantShare int64) {
		t.Helper()
		v.Reset()
		l.Decide(t.Context(), time.Time{}, reqs, limiter.Caller{}, &v)
		if len(v.States) != len(want) || len(v.Decisions) != len(reqs) {
			t.Fatalf("%s: states %v, %d decisions; want %v", step, v.States, len(v.Decisions), want)
		}
		for i, s := range want {
			d, limit := v.Decisions[i], reqs[i].Policy.Limit()
			if v.States[i] != s || s == limiter.NotAsked && d != (limiter.Decision{}) || s != limiter.NotAsked && d.Limit != limit {
				t.Fatalf("%s: zone %s %v, decision %+v; want %v, limit %d", step, reqs[i].Zone, v.States[i], d, s, limit)
			}
		}
		if got, _, _ := l.SyncShare(a); got != wantShare {
			t.Fatalf("%s: a's allowance %d; want %d", step, got, wantShare)
		}
	}
	decide("a", []limiter.Request{a}, []limiter.State{limiter.Allowed}, share-1)
	decide("b after a", []limiter.Request{b}, []limiter.State{limiter.Refused}, share-1)
	decide("a and e", []limiter.Request{a, e}, []limiter.State{limiter.NotAsked, limiter.Refused}, share-1)
	decide("e and a", []limiter.Request{e, a}, []limiter.State{limiter.Refused, limiter.NotAsked}, share-1)
	decide("a and b", []limiter.Request{a, b}, []limiter.State{limiter.NotAsked, limiter.Refused}, share-1)
	decide("a again", []limiter.Request{a}, []limiter.State{limiter.Allowed}, share-2)
	if v.Decisions[0].Remaining != share-2 || v.CallOf(0).Store != "sync" {
		t.Fatalf("a again: %+v from %q; want remaining %d from the allowance", v.Decisions[0], v.CallOf(0).Store, share-2)
	}
	if other.Decisions[0] != kept {
		t.Fatalf("another verdict's decision is now %+v; was %+v", other.Decisions[0], kept)
	}
}
