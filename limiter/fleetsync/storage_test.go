package fleetsync

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestStorageLateReading: the fleet reads its clock before it takes its
// lock, so a write's or a charge's reading may be from the window before
// the one a charge that came first counts in (a window turned meanwhile).
// It is taken in that window: the write keeps the window's counts (they
// have not faded), and the charge adds to the window's count; neither
// forgets what the window admitted.
func TestStorageLateReading(t *testing.T) {
	f := NewStorageFleet(&certmagic.FileStorage{Path: t.TempDir()}, StorageOptions{WriteEvery: time.Hour, ReadEvery: time.Hour, Timeout: time.Minute})
	clock := time.Unix(1000, 0) // a window's start
	f.now = func() time.Time { return clock }
	f.Read(time.Minute)
	f.Write(time.Minute, false)
	p := bucket.Policy{Algorithm: bucket.FixedWindow, Rate: 10, Period: time.Second, Burst: 10}
	r := bucket.Request{Zone: "api", Key: "k", Policy: p}.WithDigest(nil)
	charge := func(at time.Time, cost int64) {
		clock, r.Cost = at, cost
		if _, err := f.ChargeAll(context.Background(), []bucket.Request{r}); err != nil {
			t.Fatal(err)
		}
	}
	later := time.Unix(1000, int64(500*time.Millisecond))
	late := time.Unix(999, int64(999*time.Millisecond)) // read before the window began
	charge(time.Unix(1000, int64(time.Millisecond)), 3)
	clock = late
	f.Write(time.Minute, false)
	clock = later
	if left := f.Left(r); left != 7 {
		t.Errorf("after a write whose reading was late, %d left of 10: want 7, the window's 3 kept", left)
	}
	charge(late, 1)
	clock = later
	if left := f.Left(r); left != 6 {
		t.Errorf("after a charge whose reading was late, %d left of 10: want 6, the window's 3 and the late 1", left)
	}
}

// TestWindowTurnsQuota: a quota's window turns at its calendar period's
// end (Auckland's midnight), so that an instance reads the count of the
// new period then, as a fixed window's at its multiple of the period.
func TestWindowTurnsQuota(t *testing.T) {
	akl, _ := bucket.LoadLocation("Pacific/Auckland")
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 3, Burst: 3, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day, Loc: akl}}
	now := time.Date(2026, 6, 1, 23, 0, 0, 0, akl)
	if got, want := windowTurns(now, p), time.Date(2026, 6, 2, 0, 0, 0, 0, akl); !got.Equal(want) {
		t.Fatalf("a day in Auckland at 23:00 turns at %s, want %s", got, want)
	}
}

// TestSyncRefusalQuota: an instance that refuses a quota's request for
// want of allowance, the period's count spent as last read, says to retry
// when the period turns, not after the quota's average gap per request
// (a day of 25 hours over the quota: 8h20m for 3 a day).
func TestSyncRefusalQuota(t *testing.T) {
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 3, Burst: 3, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	now := time.Date(2026, 6, 1, 22, 0, 0, 0, time.UTC)
	e := &syncEntry{req: bucket.Request{Policy: p, Sync: 100 * time.Millisecond}, turns: windowTurns(now, p), reset: windowTurns(now, p)}
	if d := (&Syncer{}).refusal(e, 1, now); d.RetryAfter != 2*time.Hour {
		t.Fatalf("refused at 22:00 UTC: retry after %s, want 2h (midnight)", d.RetryAfter)
	}
}

// TestSyncQuotaTurnDropsOldCharges: what an instance admitted of a
// quota's period that has turned since, not charged yet, is not charged
// to the new period (which would refuse clients within the new period's
// quota for the old one's use): the old period's count is gone with its
// key, at its end. A round after the turn only reads the new period.
func TestSyncQuotaTurnDropsOldCharges(t *testing.T) {
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 30, Burst: 30, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	midnight := time.Date(2026, 6, 2, 0, 0, 0, 0, time.UTC)
	before := midnight.Add(-time.Second)
	r := bucket.Request{Zone: "q", Key: "k", Policy: p, Sync: 100 * time.Millisecond}
	e := &syncEntry{req: r, spent: 6, granted: 10, turns: windowTurns(before, p), used: before, synced: before.Add(-time.Second)}
	s := &Syncer{entries: map[bucket.ID]*syncEntry{bucket.IDOf(r): e}}
	reqs, _ := s.due(midnight.Add(time.Second), false)
	if len(reqs) != 1 || reqs[0].Cost != 0 {
		t.Fatalf("the round after midnight charges %+v; want a reading (cost 0)", reqs)
	}
}
