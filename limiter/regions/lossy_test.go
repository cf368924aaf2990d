package regions_test

import (
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// TestRegionsLossyLinks: every link between the three regions fails for
// 200 ms of every 500 ms (open connections reset, new ones refused), the
// exchanges every 100 ms within 200 ms. One client sends 40 requests a
// second in all, spread over the regions, to a global zone of 10r/s burst
// 10, for 20 s: the regions together admit at most the exact limit plus
// regions.Bound, and no less than a region's share of it.
func TestRegionsLossyLinks(t *testing.T) {
	if testing.Short() {
		t.Skip("20 s of traffic")
	}
	const interval, timeout = 100 * time.Millisecond, 200 * time.Millisecond
	w := newWorldTimeout(t, 10*time.Millisecond, interval, timeout)
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 10, Period: time.Second, Burst: 10}
	time.Sleep(3 * (interval + timeout)) // each region's mark reaches the others
	for _, tos := range w.proxies {
		for _, byNode := range tos {
			for _, px := range byNode {
				t.Cleanup(px.Flap(200*time.Millisecond, 500*time.Millisecond))
			}
		}
	}
	res := runPaced(w, "lossy", p, 75*time.Millisecond, 20*time.Second, true)
	exact := float64(p.Burst) + 10*res.span.Seconds()
	bound := regions.Bound(p, 3, interval, timeout)
	t.Logf("lossy links: admitted %v = %d of %v in %s; exact %.0f, bound %.0f more",
		res.admitted, res.total(), res.sent, res.span.Round(time.Millisecond), exact, bound)
	for _, r := range w.regions {
		r.ev.mu.Lock()
		t.Logf("%s: exchanges %v (ok, failed), link changes %d", r.name, r.ev.exchanges, len(r.ev.changes))
		r.ev.mu.Unlock()
	}
	if float64(res.total()) > exact+bound {
		t.Errorf("%d admitted over lossy links; want at most the exact %.0f plus the bound %.0f", res.total(), exact, bound)
	}
	if share := float64(p.Burst)/3 + 10*res.span.Seconds()/3; float64(res.total()) < share {
		t.Errorf("%d admitted over lossy links; want at least a region's share, %.0f", res.total(), share)
	}
}
