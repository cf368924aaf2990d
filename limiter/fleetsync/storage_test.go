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
