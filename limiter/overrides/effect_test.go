package overrides

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// effectSet is a Set of zone's override (when zo is set) and of key's
// (when ko is), each checked as an entry read is.
func effectSet(t testing.TB, zone string, key [16]byte, zo, ko *Override) *Set {
	t.Helper()
	var changes []entryChange
	if zo != nil {
		if err := zo.Check(false); err != nil {
			t.Fatalf("zone override %+v: %v", *zo, err)
		}
		changes = append(changes, entryChange{zone: zone, o: *zo})
	}
	if ko != nil {
		if err := ko.Check(true); err != nil {
			t.Fatalf("key override %+v: %v", *ko, err)
		}
		changes = append(changes, entryChange{zone: zone, digest: &key, o: *ko})
	}
	return (*Set)(nil).apply(changes, "1:test")
}

// TestEffect: what the overrides in force do to one request of a zone,
// the zone's override first, then the key's: limits, block, exemption,
// dry run, disabled; expiries; limits left out where the algorithm does
// not take them; and the fallback, when the limits of both give a policy
// the zone refuses, to the zone's alone, then to the config's.
func TestEffect(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	later, earlier := now.Add(30*time.Second).UnixMilli(), now.Add(-time.Second).UnixMilli()
	bucketPolicy := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 10, Period: time.Minute, Burst: 10}
	window := bucket.Policy{Algorithm: bucket.FixedWindow, Rate: 10, Period: time.Minute, Burst: 10}
	key, other := [16]byte{1}, [16]byte{2}
	tooBig := errors.New("burst over 50")
	check := func(p bucket.Policy) error {
		if p.Burst > 50 {
			return tooBig
		}
		return nil
	}
	yes := true
	type want struct {
		policy                   bucket.Policy
		disabled, exempt, dryRun bool
		block                    time.Duration
		hasZone, hasKey          bool
		leftOut                  string // in the reason's text; "" for none
	}
	with := func(p bucket.Policy, rate int64, period time.Duration, burst int64) bucket.Policy {
		p.Rate, p.Period, p.Burst = rate, period, burst
		return p
	}
	cases := []struct {
		name     string
		policy   bucket.Policy
		burstSet bool
		zo, ko   *Override
		key      *[16]byte
		want     want
	}{
		{name: "none", policy: bucketPolicy, key: &key, want: want{policy: bucketPolicy}},
		{name: "zone rate: its default burst", policy: bucketPolicy, zo: &Override{Rate: "5r/s"}, key: &key,
			want: want{policy: with(bucketPolicy, 5, time.Second, 5), hasZone: true}},
		{name: "zone rate: the config's burst kept", policy: bucketPolicy, burstSet: true, zo: &Override{Rate: "5r/s"}, key: &key,
			want: want{policy: with(bucketPolicy, 5, time.Second, 10), hasZone: true}},
		{name: "zone rate and burst", policy: bucketPolicy, zo: &Override{Rate: "5r/s", Burst: 20}, key: &key,
			want: want{policy: with(bucketPolicy, 5, time.Second, 20), hasZone: true}},
		{name: "zone override until later", policy: bucketPolicy, zo: &Override{Burst: 20, Expires: later}, key: &key,
			want: want{policy: with(bucketPolicy, 10, time.Minute, 20), hasZone: true}},
		{name: "zone override expired", policy: bucketPolicy, zo: &Override{Burst: 20, Expires: earlier}, key: &key,
			want: want{policy: bucketPolicy}},
		{name: "zone disabled", policy: bucketPolicy, zo: &Override{Disabled: true}, key: &key,
			want: want{policy: bucketPolicy, disabled: true, hasZone: true}},
		{name: "zone dry run", policy: bucketPolicy, zo: &Override{DryRun: &yes}, key: &key,
			want: want{policy: bucketPolicy, dryRun: true, hasZone: true}},
		{name: "key's own limit", policy: bucketPolicy, ko: &Override{Rate: "20r/m"}, key: &key,
			want: want{policy: with(bucketPolicy, 20, time.Minute, 20), hasKey: true}},
		{name: "key's burst on the zone's rate", policy: bucketPolicy, zo: &Override{Rate: "5r/s"}, ko: &Override{Burst: 30}, key: &key,
			want: want{policy: with(bucketPolicy, 5, time.Second, 30), hasZone: true, hasKey: true}},
		{name: "another key's override", policy: bucketPolicy, ko: &Override{Rate: "20r/m"}, key: &other,
			want: want{policy: bucketPolicy}},
		{name: "the zone alone: no key", policy: bucketPolicy, zo: &Override{Burst: 20}, ko: &Override{Block: true},
			want: want{policy: with(bucketPolicy, 10, time.Minute, 20), hasZone: true}},
		{name: "key's override expired", policy: bucketPolicy, ko: &Override{Block: true, Expires: earlier}, key: &key,
			want: want{policy: bucketPolicy}},
		{name: "exempt: before any limit, the config's policy", policy: bucketPolicy, zo: &Override{Rate: "5r/s", DryRun: &yes}, ko: &Override{Exempt: true}, key: &key,
			want: want{policy: bucketPolicy, exempt: true, dryRun: true, hasZone: true, hasKey: true}},
		{name: "block without expiry", policy: bucketPolicy, ko: &Override{Block: true}, key: &key,
			want: want{policy: bucketPolicy, block: MaxBlock, hasKey: true}},
		{name: "block until its expiry", policy: bucketPolicy, ko: &Override{Block: true, Expires: later}, key: &key,
			want: want{policy: bucketPolicy, block: 30 * time.Second, hasKey: true}},
		{name: "block past MaxBlock", policy: bucketPolicy, ko: &Override{Block: true, Expires: now.Add(48 * time.Hour).UnixMilli()}, key: &key,
			want: want{policy: bucketPolicy, block: MaxBlock, hasKey: true}},
		{name: "block under the zone's limit", policy: bucketPolicy, zo: &Override{Rate: "5r/s"}, ko: &Override{Block: true}, key: &key,
			want: want{policy: with(bucketPolicy, 5, time.Second, 5), block: MaxBlock, hasZone: true, hasKey: true}},
		{name: "left out: max_concurrent on a token bucket", policy: bucketPolicy, zo: &Override{MaxConcurrent: 5}, key: &key,
			want: want{policy: bucketPolicy, hasZone: true, leftOut: "max_concurrent applies to max_concurrent zones"}},
		{name: "left out: a key's burst on a window", policy: window, zo: &Override{Rate: "20r/m"}, ko: &Override{Burst: 40}, key: &key,
			want: want{policy: with(window, 20, time.Minute, 20), hasZone: true, hasKey: true, leftOut: "burst does not apply to fixed_window"}},
		{name: "refused with the key's: the zone's alone", policy: bucketPolicy, zo: &Override{Burst: 40}, ko: &Override{Burst: 60}, key: &key,
			want: want{policy: with(bucketPolicy, 10, time.Minute, 40), hasZone: true, hasKey: true, leftOut: tooBig.Error()}},
		{name: "refused, the zone's too: the config's", policy: bucketPolicy, burstSet: true, zo: &Override{Burst: 60}, ko: &Override{Rate: "1r/s"}, key: &key,
			want: want{policy: bucketPolicy, hasZone: true, hasKey: true, leftOut: tooBig.Error()}},
		{name: "the zone's refused alone: the config's", policy: bucketPolicy, zo: &Override{Burst: 60},
			want: want{policy: bucketPolicy, hasZone: true, leftOut: tooBig.Error()}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var set *Set
			if c.zo != nil || c.ko != nil {
				set = effectSet(t, "z", key, c.zo, c.ko)
			}
			clock := Clock{Now: func() time.Time { return now }}
			e := set.Effect(Target{Zone: "z", Policy: c.policy, BurstSet: c.burstSet, Check: check}, c.key, &clock)
			got := want{policy: e.Policy, disabled: e.Disabled, exempt: e.Exempt, dryRun: e.DryRun != nil && *e.DryRun,
				block: e.Block, hasZone: e.HasZone, hasKey: e.HasKey}
			if e.LeftOut != nil {
				got.leftOut = e.LeftOut.Error()
			}
			if c.want.leftOut != "" && strings.Contains(got.leftOut, c.want.leftOut) {
				got.leftOut = c.want.leftOut
			}
			if got != c.want {
				t.Errorf("effect\n got %+v\nwant %+v", got, c.want)
			}
			if d := set.Disabled("z", &clock); d != e.Disabled {
				t.Errorf("Disabled %v, and the effect's %v", d, e.Disabled)
			}
		})
	}
}

// TestEffectReadsTheClockOnce: a Clock is read only when an override with
// an expiry needs it, and once for all the zones of a request.
func TestEffectReadsTheClockOnce(t *testing.T) {
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 10, Period: time.Minute, Burst: 10}
	key := [16]byte{7}
	reads := 0
	clock := Clock{Now: func() time.Time { reads++; return time.Now() }}
	plain := effectSet(t, "z", key, &Override{Burst: 20}, &Override{Rate: "20r/m"})
	for range 3 {
		plain.Disabled("z", &clock)
		plain.Effect(Target{Zone: "z", Policy: p}, &key, &clock)
	}
	if reads != 0 {
		t.Fatalf("overrides without an expiry: the clock read %d times, want none", reads)
	}
	expiring := effectSet(t, "z", key, &Override{Burst: 20, Expires: time.Now().Add(time.Hour).UnixMilli()},
		&Override{Block: true, Expires: time.Now().Add(time.Minute).UnixMilli()})
	for range 3 {
		expiring.Disabled("z", &clock)
		if e := expiring.Effect(Target{Zone: "z", Policy: p}, &key, &clock); e.Block <= 0 || e.Policy.Burst != 20 {
			t.Fatalf("the overrides with an expiry: %+v", e)
		}
	}
	if reads != 1 {
		t.Fatalf("overrides with an expiry: the clock read %d times, want once", reads)
	}
	var none *Set
	if e := none.Effect(Target{Zone: "z", Policy: p}, &key, &Clock{Now: func() time.Time { panic("read") }}); e.Policy != p {
		t.Fatalf("no overrides: %+v", e)
	}
}

// effectBenchSets are the sets of BenchmarkEffect and
// TestEffectAllocatesNothing: key overrides, not the request's; the
// request key's own; a zone's override that expires.
func effectBenchSets(t testing.TB, key [16]byte) map[string]*Set {
	t.Helper()
	return map[string]*Set{
		"other_key": effectSet(t, "z", [16]byte{2}, nil, &Override{Rate: "20r/m"}),
		"key":       effectSet(t, "z", key, nil, &Override{Rate: "20r/m"}),
		"zone":      effectSet(t, "z", key, &Override{Rate: "20r/m", Expires: time.Now().Add(time.Hour).UnixMilli()}, nil),
	}
}

// TestEffectAllocatesNothing: the request path's Effect allocates nothing
// when the overrides fit.
func TestEffectAllocatesNothing(t *testing.T) {
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 10, Period: time.Minute, Burst: 10}
	key := [16]byte{1}
	check := func(bucket.Policy) error { return nil }
	for name, set := range effectBenchSets(t, key) {
		allocs := testing.AllocsPerRun(100, func() {
			clock := Clock{Now: time.Now}
			set.Effect(Target{Zone: "z", Policy: p, Check: check}, &key, &clock)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Effect, want none", name, allocs)
		}
	}
}

// BenchmarkEffect: one request's Effect (a Clock of its own) among key
// overrides not its own, with its own, and with a zone's override.
func BenchmarkEffect(b *testing.B) {
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 10, Period: time.Minute, Burst: 10}
	key := [16]byte{1}
	check := func(bucket.Policy) error { return nil }
	for name, set := range effectBenchSets(b, key) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				clock := Clock{Now: time.Now}
				set.Effect(Target{Zone: "z", Policy: p, Check: check}, &key, &clock)
			}
		})
	}
}
