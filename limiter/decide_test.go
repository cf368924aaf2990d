package limiter

import (
	"testing"
	"time"
)

// TestDecideDryRun: dry-run zones are decided and charged apart, never
// refuse (WouldRefuse), and do not hold back the enforced zones; the
// verdict is the same whatever the order of the zones.
func TestDecideDryRun(t *testing.T) {
	one := Policy{Algorithm: TokenBucket, Rate: 1, Period: time.Hour, Burst: 1}
	two := Policy{Algorithm: TokenBucket, Rate: 2, Period: time.Hour, Burst: 2}
	for name, dryFirst := range map[string]bool{"dry last": false, "dry first": true} {
		t.Run(name, func(t *testing.T) {
			l := NewMemoryLimiter()
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
