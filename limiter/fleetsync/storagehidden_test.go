package fleetsync

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
)

// hiddenFleet is a storage fleet with a secret whose instances share a
// directory and one clock the test sets: each a StorageFleet (never
// started: it reads and writes when the test says) and the Syncer of its
// zones, deciding as limiter.New makes them decide.
type hiddenFleet struct {
	fleets []*StorageFleet
	syncs  []*Syncer
	clock  *atomic.Int64 // Unix ns
	sub    string        // the fleet's directory
}

// hiddenStart is the hour the tests begin at: a window of an hour holds
// all of a test's first minute.
var hiddenStart = time.Unix(1_800_000_000, 0)

// newHiddenFleet makes n instances writing and reading every 50 ms, each
// counting the others.
func newHiddenFleet(t *testing.T, n int) *hiddenFleet {
	t.Helper()
	dir := t.TempDir()
	h := &hiddenFleet{clock: new(atomic.Int64), sub: filepath.Join(dir, "rate_limit", "sync")}
	h.clock.Store(hiddenStart.UnixNano())
	now := func() time.Time { return time.Unix(0, h.clock.Load()) }
	o := StorageOptions{WriteEvery: 50 * time.Millisecond, ReadEvery: 50 * time.Millisecond, Timeout: time.Minute, Secret: "0123456789abcdef-fleet"}
	for range n {
		f, m := NewStorageFleet(&certmagic.FileStorage{Path: dir}, o), memstore.New(0)
		s := NewSyncer(f, m, time.Second)
		f.now, s.now = now, now
		t.Cleanup(func() { s.Close(); m.Close() })
		h.fleets, h.syncs = append(h.fleets, f), append(h.syncs, s)
	}
	h.sync(nil)
	h.sync(nil)
	for i, f := range h.fleets {
		if got := f.Registered(); got != int64(n) {
			t.Fatalf("instance %d counts %d instances, want %d", i, got, n)
		}
	}
	return h
}

func (h *hiddenFleet) now() time.Time { return time.Unix(0, h.clock.Load()) }

// sync has every instance write its file, then attack (when not nil)
// act on the directory, then every instance read the others' files.
func (h *hiddenFleet) sync(attack func()) {
	for _, f := range h.fleets {
		f.Write(time.Minute, false)
	}
	if attack != nil {
		attack()
	}
	for _, f := range h.fleets {
		f.Read(time.Minute)
	}
}

// take has instance i decide r, and reports whether it admitted it.
func (h *hiddenFleet) take(i int, r bucket.Request) bool {
	var t Taken
	h.syncs[i].Take(h.now(), []bucket.Request{r}, 1, &t)
	return t.Allowed() && t.Decisions[0].Allowed
}

// run steps the clock by every for d: at each step, every instance
// (of those in who) tries tries requests of r, then the fleet syncs
// through attack. It returns what was admitted.
func (h *hiddenFleet) run(d, every time.Duration, who []int, tries int, r bucket.Request, attack func()) (admitted int64) {
	for end := h.now().Add(d); h.now().Before(end); h.clock.Add(int64(every)) {
		for _, i := range who {
			for range tries {
				if h.take(i, r) {
					admitted++
				}
			}
		}
		h.sync(attack)
	}
	return admitted
}

// hourOf is a request of a fixed window of limit an hour.
func hourOf(limit int64) bucket.Request {
	p := bucket.Policy{Algorithm: bucket.FixedWindow, Rate: limit, Period: time.Hour, Burst: limit}
	return bucket.Request{Zone: "api", Key: "k", Policy: p, Cost: 1, Sync: time.Hour}.WithDigest(nil)
}

// hideAll is the attacks on every file of the directory sub: rewritten
// empty, or deleted.
func hideAll(t *testing.T, sub string, deleted bool) func() {
	return func() {
		entries, err := os.ReadDir(sub)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			p := filepath.Join(sub, e.Name())
			if deleted {
				err = os.Remove(p)
			} else {
				err = os.WriteFile(p, nil, 0o600)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestStorageHiddenNoLift: three instances with a secret admit 30 of a
// window of 100 an hour, then every file is hidden from every reader for
// 30 s (three times InstancesWindow), rewritten empty after each write, or
// deleted, at every 50 ms step, while each instance is asked for 2
// requests a step (3,600 in all). Each counts the others blind (N stays
// 3, their shares spent) from the first read that does not accept their
// files: the fleet admits no more than the limit plus the bound,
// 100 + 2/3 × 100.
func TestStorageHiddenNoLift(t *testing.T) {
	for _, deleted := range []bool{false, true} {
		name := map[bool]string{false: "rewritten empty", true: "deleted"}[deleted]
		t.Run(name, func(t *testing.T) {
			h, r := newHiddenFleet(t, 3), hourOf(100)
			before := h.run(time.Second, 100*time.Millisecond, []int{0, 1, 2}, 1, r, nil)
			if before != 30 {
				t.Fatalf("the fleet admitted %d before the attack, want 30", before)
			}
			during := h.run(30*time.Second, 50*time.Millisecond, []int{0, 1, 2}, 2, r, hideAll(t, h.sub, deleted))
			const bound = 100 + 2*100/3
			t.Logf("files %s every 50 ms for 30 s: %d admitted before, %d during; limit 100, bound %d", name, before, during, bound)
			if before+during > bound {
				t.Errorf("%d admitted in a window of 100, over the limit and the bound, %d", before+during, bound)
			}
			for i, f := range h.fleets {
				if n, blind := f.Registered(), f.blindCount(); n != 3 || blind != 2 {
					t.Errorf("after 30 s, instance %d counts %d instances, %d blind: want 3, 2 blind", i, n, blind)
				}
			}
		})
	}
}

// blindCount is the instances counted blind at the last read.
func (f *StorageFleet) blindCount() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blind
}

// TestStorageHiddenStopped: an instance that stops cleanly (its last
// file says so) is no instance at the others' next read, whether it
// holds counts (c: they still count) or nothing (d, idle): with a
// secret, a file that vanishes is no word that its instance stopped, so
// an idle instance that stops writes its stopped file too.
func TestStorageHiddenStopped(t *testing.T) {
	h, r := newHiddenFleet(t, 4), hourOf(100)
	if got := h.run(time.Second, 100*time.Millisecond, []int{2}, 1, r, nil); got != 10 {
		t.Fatalf("c admitted %d, want 10", got)
	}
	h.fleets[2].Write(time.Minute, true)
	h.fleets[3].Write(time.Minute, true)
	h.fleets = h.fleets[:2]
	for _, at := range []time.Duration{0, 20 * time.Second} {
		h.clock.Store(hiddenStart.Add(time.Second + at).UnixNano())
		h.sync(nil)
		for i, f := range h.fleets {
			if n, blind, left := f.Registered(), f.blindCount(), f.Left(r); n != 2 || blind != 0 || left != 90 {
				t.Errorf("%s after c and d stopped, instance %d counts %d instances, %d blind, sees %d left: want 2, none, 90",
					at, i, n, blind, left)
			}
		}
	}
}

// TestStorageHiddenCrashed: an instance that stops without a word (c:
// its file stops changing, its counts 10 of 100 an hour) counts as it
// was until InstancesWindow after its last write, then blind (in N, its
// share, 100/3, spent) until its last file would be purged: its counts
// faded and two of the longest window counted (an hour) past its write;
// then it is no instance.
func TestStorageHiddenCrashed(t *testing.T) {
	h, r := newHiddenFleet(t, 3), hourOf(100)
	if got := h.run(time.Second, 100*time.Millisecond, []int{2}, 1, r, nil); got != 10 {
		t.Fatalf("c admitted %d, want 10", got)
	}
	crashed := h.now().Add(-100 * time.Millisecond) // c's last write
	h.fleets = h.fleets[:2]
	for _, c := range []struct {
		after          time.Duration
		n, blind, left int64
	}{
		{5 * time.Second, 3, 0, 90},
		{InstancesWindow + time.Second, 3, 1, 56}, // 100 - 10 - 100/3
		{30 * time.Minute, 3, 1, 56},
		{2*time.Hour - time.Second, 3, 1, 66}, // the window after c's: its counts past, its share spent
		{2*time.Hour + time.Second, 2, 0, 100},
	} {
		h.clock.Store(crashed.Add(c.after).UnixNano())
		h.sync(nil)
		for i, f := range h.fleets {
			if n, blind, left := f.Registered(), f.blindCount(), f.Left(r); n != c.n || blind != c.blind || left != c.left {
				t.Errorf("%s after c's last write, instance %d counts %d instances, %d blind, sees %d left: want %d, %d, %d",
					c.after, i, n, blind, left, c.n, c.blind, c.left)
			}
		}
	}
}
