package limiter

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// step is one request of a timed sequence and what the store must answer.
type step struct {
	at        time.Duration // since t0
	cost      int64
	allowed   bool
	remaining int64
	reset     time.Duration // since t0
	retry     time.Duration // zero when allowed
	delay     time.Duration // leaky bucket: the wait before passing
}

// runSteps runs a timed sequence against every store: memory, standalone
// Redis and Redis Cluster.
func runSteps(t *testing.T, p Policy, steps []step) {
	t.Helper()
	for name, newStore := range testStores {
		t.Run(name, func(t *testing.T) {
			take := newStore(t)
			for i, st := range steps {
				d, err := take(t0.Add(st.at), []Request{{Zone: "z", Key: "k", Policy: p, Cost: st.cost}})
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				want := Decision{Allowed: st.allowed, Limit: p.Limit(), Remaining: st.remaining,
					Reset: t0.Add(st.reset), RetryAfter: st.retry, Delay: st.delay}
				if !sameDecision(d[0], want) {
					t.Fatalf("step %d (at %s, cost %d):\n got %+v\nwant %+v", i, st.at, st.cost, d[0], want)
				}
			}
		})
	}
}

// sameDecision compares decisions, times to the microsecond: Redis counts
// microseconds, the memory store nanoseconds, both rounding up.
func sameDecision(a, b Decision) bool {
	near := func(d time.Duration) bool { return d > -time.Microsecond && d < time.Microsecond }
	return a.Allowed == b.Allowed && a.Limit == b.Limit && a.Remaining == b.Remaining &&
		near(a.Reset.Sub(b.Reset)) && near(a.RetryAfter-b.RetryAfter) && near(a.Delay-b.Delay)
}

func TestTokenBucketBurstThenRefill(t *testing.T) {
	p := Policy{Rate: 10, Period: time.Second, Burst: 3} // a token every 100ms
	ms := time.Millisecond
	runSteps(t, p, []step{
		{0, 1, true, 2, 100 * ms, 0, 0},
		{0, 1, true, 1, 200 * ms, 0, 0},
		{0, 1, true, 0, 300 * ms, 0, 0},
		{0, 1, false, 0, 300 * ms, 100 * ms, 0},
		{50 * ms, 1, false, 0, 300 * ms, 50 * ms, 0},
		{100 * ms, 1, true, 0, 400 * ms, 0, 0},
		{1000 * ms, 1, true, 2, 1100 * ms, 0, 0},
		{5000 * ms, 1, true, 2, 5100 * ms, 0, 0}, // capped at the burst
	})
}

func TestTokenBucketSlowRate(t *testing.T) {
	p := Policy{Rate: 1, Period: time.Hour, Burst: 2}
	h := time.Hour
	runSteps(t, p, []step{
		{0, 1, true, 1, h, 0, 0},
		{0, 1, true, 0, 2 * h, 0, 0},
		{0, 1, false, 0, 2 * h, h, 0},
		{30 * time.Minute, 1, false, 0, 2 * h, 30 * time.Minute, 0},
		{h, 1, true, 0, 3 * h, 0, 0},
		{90 * time.Minute, 1, false, 0, 3 * h, 30 * time.Minute, 0},
	})
}

func TestTokenBucketFractionalInterval(t *testing.T) {
	// 3r/s: a token every 333.33ms; three tokens must be back after 1s.
	p := Policy{Rate: 3, Period: time.Second, Burst: 3}
	third := time.Second / 3
	runSteps(t, p, []step{
		{0, 3, true, 0, time.Second, 0, 0},
		{0, 1, false, 0, time.Second, third + 1, 0}, // rounded up to the nanosecond
		{time.Second, 3, true, 0, 2 * time.Second, 0, 0},
	})
}

func TestTokenBucketCost(t *testing.T) {
	p := Policy{Rate: 10, Period: time.Second, Burst: 10}
	ms := time.Millisecond
	runSteps(t, p, []step{
		{0, 5, true, 5, 500 * ms, 0, 0},
		{0, 4, true, 1, 900 * ms, 0, 0},
		{0, 5, false, 1, 900 * ms, 400 * ms, 0}, // a refusal takes nothing
		{0, 1, true, 0, time.Second, 0, 0},
		// A cost above the burst can never pass; wait for a full bucket.
		{2 * time.Second, 11, false, 10, 2 * time.Second, 100 * ms, 0},
	})
}

// TestPolicyChangeCarriesTokensOver: a zone whose limit changes (a config
// reload) keeps its buckets: tokens carry over, capped at the new burst;
// when the rate changes, the time they took to refill carries over.
func TestPolicyChangeCarriesTokensOver(t *testing.T) {
	for name, newStore := range testStores {
		t.Run(name, func(t *testing.T) { testPolicyChange(t, newStore(t)) })
	}
}

func testPolicyChange(t *testing.T, takeAt takeAtFunc) {
	take := func(p Policy, at time.Duration) Decision {
		d, err := takeAt(t0.Add(at), []Request{{Zone: "z", Key: "k", Policy: p, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return d[0]
	}
	old := Policy{Rate: 100, Period: time.Minute, Burst: 100} // a token every 600ms
	for range 10 {
		take(old, 0)
	}
	// Lower burst: the 90 tokens left are capped at 5.
	if d := take(Policy{Rate: 100, Period: time.Minute, Burst: 5}, 0); d.Remaining != 4 {
		t.Fatalf("after lowering the burst: remaining %d; want 4", d.Remaining)
	}
	// Raised again: tokens carry over (4), not reset to a full 100.
	if d := take(old, 0); d.Remaining != 3 {
		t.Fatalf("after raising the burst: remaining %d; want 3", d.Remaining)
	}
	// A faster rate: 3 tokens of 600ms are 6 of 300ms.
	if d := take(Policy{Rate: 200, Period: time.Minute, Burst: 100}, 0); d.Remaining != 5 || !d.Reset.Equal(t0.Add(28500*time.Millisecond)) {
		t.Fatalf("after raising the rate: remaining %d, full in %s; want 5, in 28.5s", d.Remaining, d.Reset.Sub(t0))
	}
}
