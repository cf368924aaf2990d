package fleetsync

import (
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestTakenReused: a Taken reused from one take to the next, as a
// limiter.Verdict keeps it, shows each take's decisions alone (none of a
// longer take before it), and its Undo gives back what its last take
// admitted, once, and nothing when that take refused: never what an
// earlier take admitted.
func TestTakenReused(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := syncerOf(t, now)
	big := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 100, Burst: 100, Period: time.Hour}
	empty := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1, Period: time.Hour}
	req := func(zone string, p bucket.Policy, cost int64) bucket.Request {
		return bucket.Request{Zone: zone, Key: "k", Policy: p, Cost: cost, Sync: 100 * time.Millisecond}.WithDigest(nil)
	}
	a, b, r := req("a", big, 1), req("b", big, 3), req("r", empty, 1)
	seedEntry(t, s, a, now, 99, now.Add(36*time.Second)) // allowance 99
	seedEntry(t, s, b, now, 99, now.Add(36*time.Second))
	seedEntry(t, s, r, now, 0, now.Add(time.Hour)) // allowance 0
	allowances := func(step string, wantA, wantB int64) {
		t.Helper()
		gotA, _, _ := s.Share(a)
		gotB, _, _ := s.Share(b)
		if gotA != wantA || gotB != wantB {
			t.Fatalf("%s: allowances a %d, b %d; want %d, %d", step, gotA, gotB, wantA, wantB)
		}
	}
	var tk Taken
	s.Take(now, []bucket.Request{a, b}, 1, &tk)
	if !tk.Allowed() || len(tk.Decisions) != 2 || !tk.Decisions[0].Allowed || !tk.Decisions[1].Allowed {
		t.Fatalf("take of a and b: %+v; want both allowed", tk.Decisions)
	}
	allowances("a and b taken", 98, 96)

	s.Take(now, []bucket.Request{r}, 1, &tk)
	if tk.Allowed() || len(tk.Decisions) != 1 || tk.Decisions[0].Allowed || tk.Decisions[0].Limit != 1 || len(tk.Exact) != 0 {
		t.Fatalf("take of r after a and b: %+v, exact %v; want r's refusal alone", tk.Decisions, tk.Exact)
	}
	tk.Undo()
	allowances("r refused, undone", 98, 96)

	s.Take(now, []bucket.Request{b}, 1, &tk)
	tk.Undo()
	tk.Undo()
	allowances("b taken, undone twice", 98, 96)

	tk.Reset()
	s.Take(now, []bucket.Request{a, r}, 1, &tk)
	if tk.Allowed() || len(tk.Decisions) != 2 || tk.Decisions[0] != (bucket.Decision{}) || tk.Decisions[1].Limit != 1 {
		t.Fatalf("take of a and r: %+v; want a not asked, r refused", tk.Decisions)
	}
	tk.Undo()
	allowances("a and r refused, undone", 98, 96)
}
