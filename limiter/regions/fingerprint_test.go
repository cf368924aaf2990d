package regions_test

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// TestRegionsDifferentSecrets: region eu digests client keys under another
// key_secret than us and ap (its requests name other buckets). Each
// region's mark carries a fingerprint of its secret: eu and the others
// find that they differ, say so once, and decide with their shares, so
// that the regions together stay within the exact limit plus the bound
// (without fingerprints, eu admits the whole rate beside the others').
func TestRegionsDifferentSecrets(t *testing.T) {
	const interval, timeout = 100 * time.Millisecond, 200 * time.Millisecond
	w := newWorldTimeout(t, 20*time.Millisecond, interval, timeout)
	w.keyIn = map[string]string{"eu": "secret-1|"}
	zones := map[string]limiter.ZoneFingerprint{"api": {Key: "k", Limit: "l"}}
	for _, r := range w.regions {
		secret := "s2"
		if r.name == "eu" {
			secret = "s1"
		}
		r.l.SetRegionFingerprint(limiter.RegionFingerprint{Secret: secret, Zones: zones})
	}
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 30}
	time.Sleep(regions.LinkTimeout(interval, timeout)) // the marks, and the counts
	res := runPaced(w, "secret", p, 10*time.Millisecond, 3*time.Second, true)
	exact := float64(p.Burst) + 100*res.span.Seconds()
	bound := regions.Bound(p, 3, interval, timeout)
	t.Logf("different key_secret in eu: admitted %v = %d in %s; exact %.0f, bound %.0f more",
		res.admitted, res.total(), res.span.Round(time.Millisecond), exact, bound)
	if float64(res.total()) > exact+bound {
		t.Errorf("%d admitted; want at most the exact %.0f plus the bound %.0f", res.total(), exact, bound)
	}
	for _, r := range w.regions {
		r.ev.mu.Lock()
		differs := strings.Join(r.ev.differs, ", ")
		r.ev.mu.Unlock()
		want := 2 // eu: us and ap; us and ap: eu
		if r.name != "eu" {
			want = 1
		}
		if strings.Count(differs, "key_secret") != want || len(strings.Split(differs, ", ")) != want {
			t.Errorf("%s reported %q; want key_secret, once for each region whose secret differs (%d)", r.name, differs, want)
		}
	}
	links, counted := w.regions[1].l.RegionLinks()
	if counted != 1 {
		t.Errorf("us counts %d regions (links %+v); want itself alone while eu differs", counted, links)
	}
}

// TestRegionsDifferentLimits: us decides zone api at twice the rate of
// eu and ap, and its fingerprint says so: every region decides with its
// share, and the regions together stay within the exact limit of the
// most generous rate plus the bound; once us agrees (its config fixed),
// they are counted again.
func TestRegionsDifferentLimits(t *testing.T) {
	const interval, timeout = 100 * time.Millisecond, 200 * time.Millisecond
	w := newWorldTimeout(t, 20*time.Millisecond, interval, timeout)
	fp := func(limit string) limiter.RegionFingerprint {
		return limiter.RegionFingerprint{Secret: "s", Zones: map[string]limiter.ZoneFingerprint{"api": {Key: "k", Limit: limit}}}
	}
	for _, r := range w.regions {
		r.l.SetRegionFingerprint(fp("100r/s"))
	}
	w.regions[1].l.SetRegionFingerprint(fp("200r/s"))
	w.rateIn = map[string]int64{"us": 200}
	time.Sleep(regions.LinkTimeout(interval, timeout))
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 30}
	res := runPaced(w, "limits", p, 10*time.Millisecond, 3*time.Second, true)
	p.Rate = 200 // the most generous
	exact := float64(p.Burst) + 200*res.span.Seconds()
	bound := regions.Bound(p, 3, interval, timeout)
	t.Logf("different limit in us: admitted %v = %d in %s; exact %.0f, bound %.0f more", res.admitted, res.total(), res.span.Round(time.Millisecond), exact, bound)
	if float64(res.total()) > exact+bound {
		t.Errorf("%d admitted; want at most the exact %.0f plus the bound %.0f", res.total(), exact, bound)
	}
	w.regions[0].ev.mu.Lock()
	differs := strings.Join(w.regions[0].ev.differs, ", ")
	w.regions[0].ev.mu.Unlock()
	if !strings.Contains(differs, `zone \"api\"'s algorithm, rate or burst`) {
		t.Errorf("eu reported %q; want us's zone api's limit named", differs)
	}
	w.regions[1].l.SetRegionFingerprint(fp("100r/s"))
	deadline := time.Now().Add(4 * regions.LinkTimeout(interval, timeout))
	for _, counted := w.regions[0].l.RegionLinks(); counted != 3; _, counted = w.regions[0].l.RegionLinks() {
		if time.Now().After(deadline) {
			t.Fatalf("eu counts %d regions after us agrees again; want 3", counted)
		}
		time.Sleep(interval / 2)
	}
}
