package fleetsync

import (
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// benchEntry is a warm Syncer of one instance (no rounds: see
// quotaSyncer) holding an entry of r's bucket, seeded as limiter.takeSynced
// seeds it: the bucket's first request left to the fleet, whose answer
// says it holds remaining, full again at reset.
func benchEntry(b *testing.B, r bucket.Request, now time.Time, remaining int64, reset time.Time) *Syncer {
	clock := now
	f := &quotaFleet{counts: map[bucket.ID]map[int64]int64{}, server: func() time.Time { return clock }}
	s := quotaSyncer(b, f, &clock)
	d, exact, undo := s.Take(now, []bucket.Request{r}, 1)
	if undo == nil || len(exact) != 1 {
		b.Fatalf("first take: %+v, exact %v; want it left to the fleet", d, exact)
	}
	s.Seed(r, bucket.Decision{Allowed: true, Limit: r.Policy.Limit(), Remaining: remaining, Reset: reset, At: now}, now, 1)
	if _, _, ok := s.Share(r); !ok {
		b.Fatal("no entry after the seed")
	}
	return s
}

// BenchmarkSyncTake: Syncer.Take of one request of a token bucket that
// syncs, on a warm entry, as limiter.takeSynced calls it: allowed from
// the allowance (a bucket of a billion tokens, never half spent), and
// refused (a bucket of 1 an hour, empty, which the allowance and a
// confirmation in the fleet both lack).
func BenchmarkSyncTake(b *testing.B) {
	now := time.Unix(1_700_000_000, 0)
	b.Run("allowed", func(b *testing.B) {
		p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1e9, Burst: 1e9, Period: time.Second}
		r := bucket.Request{Zone: "z", Key: "k", Policy: p, Cost: 1, Sync: 100 * time.Millisecond}.WithDigest(nil)
		s := benchEntry(b, r, now, p.Burst-1, now)
		reqs := []bucket.Request{r}
		b.ReportAllocs()
		for b.Loop() {
			d, exact, undo := s.Take(now, reqs, 1)
			if undo == nil || len(exact) != 0 || !d[0].Allowed {
				b.Fatalf("refused or left to the fleet: %+v, exact %v", d, exact)
			}
		}
	})
	b.Run("refused", func(b *testing.B) {
		p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1, Period: time.Hour}
		r := bucket.Request{Zone: "z", Key: "k", Policy: p, Cost: 1, Sync: 100 * time.Millisecond}.WithDigest(nil)
		s := benchEntry(b, r, now, 0, now.Add(time.Hour))
		reqs := []bucket.Request{r}
		b.ReportAllocs()
		for b.Loop() {
			d, exact, undo := s.Take(now, reqs, 1)
			if undo != nil || len(exact) != 0 || d[0].Allowed {
				b.Fatalf("allowed or left to the fleet: %+v, exact %v", d, exact)
			}
		}
	})
}
