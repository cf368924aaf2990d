package fleetsync

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// clockedPair is two fleets sharing a directory, signing with a secret,
// each on its own clock (set by the test), reading and writing only when
// the test says.
func clockedPair(t *testing.T) (a, b *StorageFleet, aClock, bClock *time.Time, dir string) {
	t.Helper()
	dir = t.TempDir()
	o := StorageOptions{WriteEvery: time.Second, ReadEvery: time.Second, Timeout: time.Minute, Secret: "0123456789abcdef-fleet"} // never started
	a, b = NewStorageFleet(&certmagic.FileStorage{Path: dir}, o), NewStorageFleet(&certmagic.FileStorage{Path: dir}, o)
	start := time.Unix(1_800_000_000, 0)
	aClock, bClock = &start, new(time.Time)
	*bClock = start
	a.now, b.now = func() time.Time { return *aClock }, func() time.Time { return *bClock }
	return a, b, aClock, bClock, filepath.Join(dir, "rate_limit", "sync")
}

// TestStorageReplayDeleted: with a secret, an instance's file deleted
// (what a secret does not prevent) leaves its last counts counted, and
// the instance counted blind (its share, 50, taken as spent) past
// InstancesWindow, until its counts have faded and two of the longest
// window counted have passed since its last signed write: then it is
// forgotten.
func TestStorageReplayDeleted(t *testing.T) {
	a, b, aClock, bClock, sub := clockedPair(t)
	p := bucket.Policy{Algorithm: bucket.FixedWindow, Rate: 100, Period: time.Hour, Burst: 100}
	r := bucket.Request{Zone: "api", Key: "k", Policy: p, Cost: 40}.WithDigest(nil)
	a.Read(time.Minute)
	a.Write(time.Minute, false)
	if _, err := a.ChargeAll(context.Background(), []bucket.Request{r}); err != nil {
		t.Fatal(err)
	}
	a.Write(time.Minute, false)
	b.Read(time.Minute)
	if left, n := b.Left(r), b.Registered(); left != 60 || n != 2 {
		t.Fatalf("b sees %d left and %d instances, want 60 and 2", left, n)
	}
	if err := os.Remove(filepath.Join(sub, a.ID()+".json")); err != nil {
		t.Fatal(err)
	}
	*bClock = bClock.Add(time.Second)
	b.Read(time.Minute)
	if left, n := b.Left(r), b.Registered(); left != 10 || n != 2 {
		t.Errorf("a's file deleted: b sees %d left and %d instances, want 10 and 2 (a's last file, a blind)", left, n)
	}
	*bClock = aClock.Add(InstancesWindow + time.Second)
	b.Read(time.Minute)
	if left, n := b.Left(r), b.Registered(); left != 10 || n != 2 {
		t.Errorf("InstancesWindow after a's last write: b sees %d left and %d instances, want 10 and 2", left, n)
	}
	*bClock = aClock.Add(2*time.Hour - time.Second)
	b.Read(time.Minute)
	if n := b.Registered(); n != 2 {
		t.Errorf("just before two hours after a's last write: b counts %d instances, want 2", n)
	}
	*bClock = aClock.Add(2*time.Hour + time.Second)
	b.Read(time.Minute)
	if left, remembered, n := b.Left(r), len(b.signed), b.Registered(); left != 100 || remembered != 0 || n != 1 {
		t.Errorf("a's counts faded: b sees %d left, remembers %d files, counts %d instances: want 100, none, 1", left, remembered, n)
	}
}

// TestStorageReplayAhead: with a secret, a file signed by an instance
// whose clock is an hour ahead is not counted, nor remembered: once that
// clock is set right, its files count again.
func TestStorageReplayAhead(t *testing.T) {
	a, b, aClock, bClock, _ := clockedPair(t)
	*aClock = bClock.Add(time.Hour)
	a.Write(time.Minute, false)
	b.Read(time.Minute)
	if n := b.Registered(); n != 1 {
		t.Fatalf("b counts %d instances beside a file written an hour ahead, want 1", n)
	}
	*aClock = *bClock
	a.Write(time.Minute, false)
	b.Read(time.Minute)
	if n := b.Registered(); n != 2 {
		t.Fatalf("b counts %d instances once a's clock is right, want 2", n)
	}
}
