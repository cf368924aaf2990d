package fleetsync

import (
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// syncerOf is a warm Syncer of one instance at now (no rounds: see
// quotaSyncer).
func syncerOf(tb testing.TB, now time.Time) *Syncer {
	clock := now
	f := &quotaFleet{counts: map[bucket.ID]map[int64]int64{}, server: func() time.Time { return clock }}
	return quotaSyncer(tb, f, &clock)
}

// seedEntry gives s an entry of r's bucket, seeded as limiter.takeSynced
// seeds it: the bucket's first request left to the fleet, whose answer
// says it holds remaining, full again at reset.
func seedEntry(tb testing.TB, s *Syncer, r bucket.Request, now time.Time, remaining int64, reset time.Time) {
	tb.Helper()
	var t Taken
	s.Take(now, []bucket.Request{r}, 1, &t)
	if !t.Allowed() || len(t.Exact) != 1 {
		tb.Fatalf("first take: %+v, exact %v; want it left to the fleet", t.Decisions, t.Exact)
	}
	s.Seed(r, bucket.Decision{Allowed: true, Limit: r.Policy.Limit(), Remaining: remaining, Reset: reset, At: now}, now, 1)
	if _, _, ok := s.Share(r); !ok {
		tb.Fatal("no entry after the seed")
	}
}

// BenchmarkSyncTake: Syncer.Take of one request of a token bucket that
// syncs, on a warm entry, into a Taken kept from one take to the next,
// as limiter.takeSynced calls it (a Verdict keeps it): allowed from
// the allowance (a bucket of a billion tokens, never half spent), and
// refused (a bucket of 1 an hour, empty, which the allowance and a
// confirmation in the fleet both lack).
func BenchmarkSyncTake(b *testing.B) {
	now := time.Unix(1_700_000_000, 0)
	b.Run("allowed", func(b *testing.B) {
		p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1e9, Burst: 1e9, Period: time.Second}
		r := bucket.Request{Zone: "z", Key: "k", Policy: p, Cost: 1, Sync: 100 * time.Millisecond}.WithDigest(nil)
		s := syncerOf(b, now)
		seedEntry(b, s, r, now, p.Burst-1, now)
		reqs := []bucket.Request{r}
		var t Taken
		b.ReportAllocs()
		for b.Loop() {
			t.Reset()
			s.Take(now, reqs, 1, &t)
			if !t.Allowed() || len(t.Exact) != 0 || !t.Decisions[0].Allowed {
				b.Fatalf("refused or left to the fleet: %+v, exact %v", t.Decisions, t.Exact)
			}
		}
	})
	b.Run("refused", func(b *testing.B) {
		p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1, Period: time.Hour}
		r := bucket.Request{Zone: "z", Key: "k", Policy: p, Cost: 1, Sync: 100 * time.Millisecond}.WithDigest(nil)
		s := syncerOf(b, now)
		seedEntry(b, s, r, now, 0, now.Add(time.Hour))
		reqs := []bucket.Request{r}
		var t Taken
		b.ReportAllocs()
		for b.Loop() {
			t.Reset()
			s.Take(now, reqs, 1, &t)
			if t.Allowed() || len(t.Exact) != 0 || t.Decisions[0].Allowed {
				b.Fatalf("allowed or left to the fleet: %+v, exact %v", t.Decisions, t.Exact)
			}
		}
	})
}
