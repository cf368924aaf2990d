package fleetsync

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
)

// The turns of a quota's period under sync, on a clock the tests set:
// Redis decides on its own clock, which a test cannot move to midnight,
// so these run the Syncer on quotaFleet, a fleet in memory that counts
// per bucket and period as quota.lua does (the accuracy against real
// Redis: TestSyncAccuracyQuota).

// quotaFleet is a fleet of quota counts: a count per bucket and period,
// decided on its own clock (server), as quota.lua does in "charge" mode.
type quotaFleet struct {
	mu     sync.Mutex
	server func() time.Time
	counts map[bucket.ID]map[int64]int64 // bucket → period start → count
	during func()                        // run inside ChargeAll, after Redis decided (the round in flight)
}

func (f *quotaFleet) count(r bucket.Request, at time.Time) int64 {
	s, _ := r.Policy.Calendar.Bounds(at)
	return f.counts[bucket.IDOf(r)][s.UnixNano()]
}

func (f *quotaFleet) decide(r bucket.Request, charge bool) bucket.Decision {
	now := f.server()
	s, e := r.Policy.Calendar.Bounds(now)
	id := bucket.IDOf(r)
	if f.counts[id] == nil {
		f.counts[id] = map[int64]int64{}
	}
	c := f.counts[id][s.UnixNano()]
	ok := charge || r.Cost <= r.Policy.Rate-c
	if ok {
		c += r.Cost
	}
	f.counts[id][s.UnixNano()] = c
	d := bucket.Decision{Allowed: ok, Limit: r.Policy.Limit(), Remaining: max(r.Policy.Rate-c, 0), Reset: e, At: now, Used: c}
	if !ok {
		d.RetryAfter = e.Sub(now)
	}
	return d
}

func (f *quotaFleet) ChargeAll(_ context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	f.mu.Lock()
	d := make([]bucket.Decision, len(reqs))
	for i, r := range reqs {
		d[i] = f.decide(r, true)
	}
	f.mu.Unlock()
	if f.during != nil {
		f.during()
	}
	return d, nil
}

func (f *quotaFleet) Groups(_ context.Context, reqs []bucket.Request) [][]int {
	all := make([]int, len(reqs))
	for i := range all {
		all[i] = i
	}
	return [][]int{all}
}
func (f *quotaFleet) RegisterSync(context.Context, string, time.Duration) (int64, error) {
	return 1, nil
}
func (f *quotaFleet) CountSync(context.Context, string, time.Duration) (int64, error) { return 1, nil }

// quotaSyncer is a warm Syncer of one instance on f whose clock the test
// sets; it runs no rounds of its own (the test calls round).
func quotaSyncer(t testing.TB, f *quotaFleet, clock *time.Time) *Syncer {
	m := memstore.New(0)
	t.Cleanup(func() { m.Close() })
	s := NewSyncer(f, m, time.Second)
	s.now = func() time.Time { return *clock }
	s.warm.Store(true)
	s.started.Do(func() {})                                  // no background rounds
	s.lastSeen = time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC) // no registrations in rounds
	return s
}

// decide is one request through the Syncer as limiter.takeSynced makes it:
// from the allowance, else exactly in the fleet, which seeds the entry.
func decide(s *Syncer, f *quotaFleet, r bucket.Request, now time.Time) bucket.Decision {
	var t Taken
	s.Take(now, []bucket.Request{r}, 1, &t)
	if t.Allowed() && len(t.Exact) > 0 {
		f.mu.Lock()
		dd := f.decide(r, false)
		f.mu.Unlock()
		s.Seed(r, dd, now, 1)
		return dd
	}
	return t.Decisions[0]
}

// TestQuotaSyncNewDayWhole: a client that spent its day's quota of 3
// yesterday, on one instance syncing every 10s, sends a request at
// 00:00:05: its new day is whole, and the exact quota admits it. (The
// instance refused it, on yesterday's allowance and reading, until its
// next round, and said to retry in 24 hours.)
func TestQuotaSyncNewDayWhole(t *testing.T) {
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 3, Burst: 3, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	r := bucket.Request{Zone: "q", Key: "k", Policy: p, Cost: 1, Sync: 10 * time.Second}.WithDigest(nil)
	midnight := time.Date(2026, 6, 2, 0, 0, 0, 0, time.UTC)
	clock := midnight.Add(-30 * time.Second)
	f := &quotaFleet{counts: map[bucket.ID]map[int64]int64{}, server: func() time.Time { return clock }}
	s := quotaSyncer(t, f, &clock)
	for i := range 3 {
		if d := decide(s, f, r, clock); !d.Allowed {
			t.Fatalf("request %d of 3 refused", i+1)
		}
	}
	clock = midnight.Add(-2 * time.Second)
	s.round(false) // charges the 2 admitted from the allowance: the day's count is 3
	clock = midnight.Add(5 * time.Second)
	s.round(false) // the entry was read 7s ago, less than its sync: not read again yet
	d := decide(s, f, r, clock)
	if !d.Allowed {
		t.Errorf("at 00:00:05, the first request of a new day (quota 3) is refused, retry after %s; the exact quota (fleet count %d) admits it",
			d.RetryAfter, f.count(r, clock))
	}
}

// TestQuotaSyncTurnNotBackward: a round that starts before midnight and
// is applied after it must not set the period's turn back to that
// midnight, after a take of the new day moved it to the next: the next
// take would turn the period a second time and drop what this instance
// admitted of the new day while the round was in flight, never charged.
// One instance (bound 0) admitted 40 of a day's quota of 30.
func TestQuotaSyncTurnNotBackward(t *testing.T) {
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 30, Burst: 30, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	r := bucket.Request{Zone: "q", Key: "k", Policy: p, Cost: 1, Sync: 100 * time.Millisecond}.WithDigest(nil)
	midnight := time.Date(2026, 6, 2, 0, 0, 0, 0, time.UTC)
	clock := midnight.Add(-time.Second)
	f := &quotaFleet{counts: map[bucket.ID]map[int64]int64{}, server: func() time.Time { return clock }}
	s := quotaSyncer(t, f, &clock)
	for range 16 { // yesterday: 16 of 30 (1 exact, 15 from the allowance)
		if d := decide(s, f, r, clock); !d.Allowed {
			t.Fatal("refused yesterday")
		}
	}
	newDay := 0
	clock = midnight.Add(-10 * time.Millisecond) // a round starts, Redis answers before midnight
	f.during = func() {                          // the reply travels; midnight passes; requests come
		f.during = nil
		clock = midnight.Add(5 * time.Millisecond)
		for range 10 {
			if decide(s, f, r, clock).Allowed {
				newDay++
			}
		}
		clock = midnight.Add(10 * time.Millisecond)
	}
	s.round(false)
	clock = midnight.Add(20 * time.Millisecond)
	if decide(s, f, r, clock).Allowed {
		newDay++
	}
	for i := 1; i <= 20; i++ { // rounds and requests through the new day's first seconds
		clock = midnight.Add(time.Duration(i) * 200 * time.Millisecond)
		s.round(false)
		for range 5 {
			if decide(s, f, r, clock).Allowed {
				newDay++
			}
		}
	}
	s.round(true)
	if newDay > 30 {
		t.Errorf("one instance admitted %d of a day's quota of 30 in the new day; the fleet counts %d", newDay, f.count(r, clock))
	}
}

// TestQuotaSyncRaisedQuota: a key on a plan of 3 a day spent it by noon;
// its plan becomes 100 a day (a placeholder tier, or an override). Its
// next request, within the new quota (3 of 100 counted), passes: the
// instance does not refuse it on the old plan's reading (it did, until
// its next round, and said to retry at midnight, 12 hours away).
func TestQuotaSyncRaisedQuota(t *testing.T) {
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 3, Burst: 3, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	r := bucket.Request{Zone: "q", Key: "k", Policy: p, Cost: 1, Sync: 10 * time.Second}.WithDigest(nil)
	clock := time.Date(2026, 6, 2, 11, 59, 0, 0, time.UTC)
	f := &quotaFleet{counts: map[bucket.ID]map[int64]int64{}, server: func() time.Time { return clock }}
	s := quotaSyncer(t, f, &clock)
	for range 3 {
		decide(s, f, r, clock)
	}
	clock = clock.Add(55 * time.Second)
	s.round(false) // charged: the day's count is 3, read at 11:59:55
	clock = clock.Add(5 * time.Second)
	up := r
	up.Policy.Rate, up.Policy.Burst = 100, 100
	if d := decide(s, f, up, clock); !d.Allowed {
		t.Errorf("at noon, 3 used of a new quota of 100: refused, retry after %s", d.RetryAfter)
	}
}
