package fleetsync_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
)

// storageFleetOf is n Limiters sharing one directory through Caddy's file
// system storage, writing and reading every every.
func storageFleetOf(t *testing.T, dir string, n int, every time.Duration, ev fleetsync.StorageEvents) []*instance {
	t.Helper()
	var fleet []*instance
	for range n {
		l := newInstance(&certmagic.FileStorage{Path: dir}, fleetsync.StorageOptions{WriteEvery: every, ReadEvery: every, Events: ev})
		t.Cleanup(func() { l.Close() })
		fleet = append(fleet, l)
	}
	for _, l := range fleet { // each sees the others' first files
		l.fleet.Read(time.Second)
		l.CountSync(context.Background(), every)
	}
	// On a loaded machine a read may miss a file (its budget spent): read
	// again until each counts the fleet (at least: others may share dir).
	for deadline := time.Now().Add(10 * time.Second); ; {
		all := true
		for _, l := range fleet {
			if l.fleet.Registered() < int64(n) {
				all = false
				l.fleet.Read(time.Second)
				l.CountSync(context.Background(), every)
			}
		}
		if all || time.Now().After(deadline) {
			return fleet
		}
	}
}

// TestStorageFleetBounded: three instances sharing a directory, a window
// of 100 a second, flooded through all three for two seconds: the fleet
// admits at most the exact count of the windows the flood touched plus
// the bound of a sync as long as a write and a read, and most of what the
// exact limit admits; every instance counts the three. The bound holds
// while the fleet is in sync: a write or a read late by 3 intervals makes
// the rounds fail, and each instance admits its on_store_error local
// share on top (the design); the flood (six goroutines that never wait,
// on two cores) delays the writes and reads by up to a second or more.
func TestStorageFleetBounded(t *testing.T) {
	const every = time.Second // a write or a read late by less than 3 of them is no failure, on a busy machine
	for _, algo := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		t.Run(algo.String(), func(t *testing.T) {
			fleet := storageFleetOf(t, t.TempDir(), 3, every, nil)
			if n := fleet[0].Instances(); n != 3 {
				t.Fatalf("an instance counts %d instances, want 3", n)
			}
			floodWindows(t, fleet, algo, 2*every, 2*every) // a sync of a write and a read
		})
	}
}

// recordedStorage records the storage events.
type recordedStorage struct {
	mu                 sync.Mutex
	failing, recovered int
	skipped            []string
	lastErr            error
}

func (r *recordedStorage) StorageFailing(err error) {
	r.mu.Lock()
	r.failing++
	r.lastErr = err
	r.mu.Unlock()
}
func (r *recordedStorage) StorageRecovered() { r.mu.Lock(); r.recovered++; r.mu.Unlock() }
func (r *recordedStorage) FileSkipped(name string, err error) {
	r.mu.Lock()
	r.skipped = append(r.skipped, name)
	r.mu.Unlock()
}

// TestStorageFleetFiles: a file that is not an instance's counts is
// skipped and reported once; an instance that stops writes what it
// counted, and one that starts after it reads it (a window spent before a
// restart stays spent); the files hold digests, never a client key.
func TestStorageFleetFiles(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "rate_limit", "sync")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "bad.json"), []byte(`{"v":1,"instance":"bad","buckets":[{"z":"api"`), 0o600); err != nil {
		t.Fatal(err)
	}
	ev := &recordedStorage{}
	const every = time.Second // a write or a read late by less than 3 of them is no failure (nor a local share on top), on a busy machine
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 10, Period: time.Hour, Burst: 10}
	req := limiter.Request{Zone: "api", Key: "secret-client-key", Policy: p, Cost: 1, Sync: every}.WithDigest(nil)
	first := storageFleetOf(t, dir, 1, every, ev)[0]
	if admitted, _, _ := floodSync([]*instance{first}, req, 300*time.Millisecond); admitted != 10 {
		t.Fatalf("one instance admitted %d of a window of 10", admitted)
	}
	first.Close()
	second := storageFleetOf(t, dir, 1, every, ev)[0]
	if admitted, _, _ := floodSync([]*instance{second}, req, 300*time.Millisecond); admitted != 0 {
		t.Fatalf("after the restart, %d admitted from a window spent before it", admitted)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.skipped) != 2 || ev.skipped[0] != "bad.json" || ev.failing != 0 { // once by each instance
		t.Fatalf("skipped %v, failing %d: want bad.json once per instance, no failure", ev.skipped, ev.failing)
	}
	files, _ := filepath.Glob(filepath.Join(sub, "*.json"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if string(b) != "" && strings.Contains(string(b), "secret-client-key") {
			t.Fatalf("%s holds the client key: %s", f, b)
		}
	}
}

// TestStorageFleetFailing: while the storage cannot be listed or written
// (a file in the place of its directory), each of two instances admits its share
// of the limit (on_store_error local's), reported once; when the storage
// is back, recovery is reported, and what was admitted meanwhile counts:
// no more than the bound follows.
func TestStorageFleetFailing(t *testing.T) {
	dir := t.TempDir()
	sub, real, file := filepath.Join(dir, "rate_limit"), filepath.Join(dir, "real"), filepath.Join(dir, "file")
	// rate_limit is a link, swapped at once (a rename) to a file and back
	swap := func(to string) {
		if err := os.Symlink(to, sub+".new"); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(sub+".new", sub); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	swap(real)
	ev := &recordedStorage{}
	const every = 50 * time.Millisecond
	fleet := storageFleetOf(t, dir, 2, every, ev)
	swap(file)
	time.Sleep(4 * every) // the others' counts go stale
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 40, Period: time.Hour, Burst: 40}
	req := limiter.Request{Zone: "api", Key: "k", Policy: p, Cost: 1, Sync: 2 * every}.WithDigest(nil)
	admitted, _, _ := floodSync(fleet, req, 500*time.Millisecond)
	if admitted > 40 || admitted < 30 {
		t.Fatalf("while the storage fails, two instances admitted %d of a window of 40: want their shares, 20 each", admitted)
	}
	swap(real)
	time.Sleep(6 * every)
	if more, _, _ := floodSync(fleet, req, 300*time.Millisecond); admitted+more > 40+20 { // the bound: (N-1)/N of the window's 40, what an instance reads before the other's charge
		t.Fatalf("after the storage is back, %d more admitted: %d in all from a window of 40", more, admitted+more)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.failing != 2 || ev.recovered != 2 || !strings.Contains(fmt.Sprint(ev.lastErr), "rate_limit/sync") {
		t.Fatalf("failing reported %d times (%v), recovered %d: want once each per instance", ev.failing, ev.lastErr, ev.recovered)
	}
}

// turn sends req through each instance of fleet once, and counts the
// cost admitted; refused: a request was not admitted.
func turn(fleet []*instance, req limiter.Request) (admitted int64, refused bool) {
	for _, l := range fleet {
		var v limiter.Verdict
		l.Decide(context.Background(), time.Time{}, []limiter.Request{req}, limiter.Caller{Fallback: limiter.Fallback{Mode: limiter.FallbackDeny}}, &v)
		if v.States[0] == limiter.Allowed {
			admitted += req.Cost
		} else {
			refused = true
		}
		v.Release()
	}
	return admitted, refused
}

// turns sends req through each instance of fleet in turn, pausing pause
// after each turn, for d, and counts the cost admitted.
func turns(fleet []*instance, req limiter.Request, d, pause time.Duration) (admitted int64) {
	for start := time.Now(); time.Since(start) < d; time.Sleep(pause) {
		a, _ := turn(fleet, req)
		admitted += a
	}
	return admitted
}

// turnsUntil is turns until done, asked after each turn (refused: a
// request of it was), says that turn is the last; it fails t when that
// takes more than 10 s (what: what it waits for).
func turnsUntil(t *testing.T, fleet []*instance, req limiter.Request, pause time.Duration, what string, done func(refused bool) bool) (admitted int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(pause) {
		a, refused := turn(fleet, req)
		admitted += a
		if done(refused) {
			return admitted
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d admitted, and still not %s after 10 s", admitted, what)
		}
	}
}

// TestStorageFleetCostOverShare: a cost over an instance's share (a limit
// of 5 over 10 instances; a cost of 5 from 10 over 3) is decided by the
// bucket's owner alone, on what the fleet left: the limit, not each
// instance's whole view of it.
func TestStorageFleetCostOverShare(t *testing.T) {
	const every = 200 * time.Millisecond // a read late by less than 3 of them is no failure, on a busy machine
	for _, c := range []struct{ n, limit, cost int64 }{{10, 5, 1}, {3, 10, 5}} {
		fleet := storageFleetOf(t, t.TempDir(), int(c.n), every, nil)
		p := limiter.Policy{Algorithm: limiter.FixedWindow, Rate: c.limit, Period: time.Hour, Burst: c.limit}
		req := limiter.Request{Zone: "api", Key: "k", Policy: p, Cost: c.cost, Sync: 2 * every}.WithDigest(nil)
		if got := turns(fleet, req, time.Second, 10*time.Millisecond); got != c.limit {
			t.Errorf("%d instances, a limit of %d, a cost of %d: %d admitted, want %d", c.n, c.limit, c.cost, got, c.limit)
		}
	}
}

// TestStorageFleetShortWindows: a window shorter than the sync (10 in
// 200 ms, synced every second) admits about its limit in every window on
// one instance: the instance reads the bucket again as each window turns.
func TestStorageFleetShortWindows(t *testing.T) {
	const every = 500 * time.Millisecond
	fleet := storageFleetOf(t, t.TempDir(), 1, every, nil)
	for _, algo := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		p := limiter.Policy{Algorithm: algo, Rate: 10, Period: 200 * time.Millisecond, Burst: 10}
		req := limiter.Request{Zone: "z" + algo.String(), Key: "k", Policy: p, Cost: 1, Sync: 2 * every}.WithDigest(nil)
		got := turns(fleet, req, 2*time.Second, 5*time.Millisecond)
		t.Logf("%s, 10 in 200 ms, sync 1s: %d admitted in 2 s (the exact limit: about 100)", algo, got)
		if got < 50 || got > 110 {
			t.Errorf("%s: %d admitted in 2 s of 10 per 200 ms", algo, got)
		}
	}
}

// sizedFileStorage is Caddy's file system storage telling sizes (as the
// handler's storage does, through certmagic's Stat).
type sizedFileStorage struct{ *certmagic.FileStorage }

func (s sizedFileStorage) Size(ctx context.Context, key string) (int64, error) {
	info, err := s.Stat(ctx, key)
	return info.Size, err
}

// TestStorageFleetHostileFiles: what else lies in the directory costs a
// timeout at most, once, and is reported: ten FIFOs where files should be
// (reading one never ends) neither hold the config's load (one timeout
// for the whole first read) nor the instance's stop; a file too large to be an instance's counts is not
// read; a file written an hour ahead of this clock is not counted as an
// instance. The instances that write their files still count each other.
// With a secret, the same, but the file too large to read is no instance
// either: its time cannot be trusted.
func TestStorageFleetHostileFiles(t *testing.T) {
	for _, secret := range []string{"", fleetSecret} {
		t.Run(fmt.Sprintf("secret %v", secret != ""), func(t *testing.T) { hostileFleet(t, secret) })
	}
}

// hostileFleet is TestStorageFleetHostileFiles with secret.
func hostileFleet(t *testing.T, secret string) {
	dir := t.TempDir()
	hostileFiles(t, syncDir(t, dir))
	ev := &recordedStorage{}
	st := sizedFileStorage{&certmagic.FileStorage{Path: dir}}
	o := fleetsync.StorageOptions{WriteEvery: 50 * time.Millisecond, ReadEvery: 50 * time.Millisecond, Timeout: 200 * time.Millisecond, Events: ev, Secret: secret}
	start := time.Now()
	a, b := newInstance(st, o), newInstance(st, o)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("two instances took %s to start", took)
	}
	time.Sleep(3 * time.Second) // each FIFO costs a read a timeout once, then is skipped at once
	if n, want := a.fleet.Registered(), map[bool]int64{false: 3, true: 2}[secret != ""]; n != want {
		t.Errorf("an instance counts %d instances, want %d (the FIFOs and the file from the future left out; the file too large to read, written lately, counts blind without a secret)", n, want)
	}
	start = time.Now()
	a.Close()
	b.Close()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("two instances took %s to stop", took)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var skipped []string // the instances' own files may be skipped too, when a read of one is slow
	for _, name := range ev.skipped {
		if name != a.fleet.ID()+".json" && name != b.fleet.ID()+".json" {
			skipped = append(skipped, name)
		}
	}
	slices.Sort(skipped)
	want := []string{"a0a0a0a0a0a0a0a0.json", "a0a0a0a0a0a0a0a0.json", "b1b1b1b1b1b1b1b1.json", "b1b1b1b1b1b1b1b1.json"}
	for i := range 10 {
		want = append(want, fmt.Sprintf("fifo%d.json", i), fmt.Sprintf("fifo%d.json", i))
	}
	slices.Sort(want)
	if !slices.Equal(skipped, want) {
		t.Errorf("skipped %v, want %v (each once per instance)", skipped, want)
	}
}

// hostileFiles lays in sub what else may lie in a fleet's directory: ten
// FIFOs where files should be (a read of one never ends; the reads that
// wait on them end when the test does), a file too large to be an
// instance's counts, and one written an hour ahead of this clock.
func hostileFiles(t *testing.T, sub string) {
	t.Helper()
	for i := range 10 {
		fifo := filepath.Join(sub, fmt.Sprintf("fifo%d.json", i))
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { // let the reads that wait on it end
			for range 2 {
				if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					w.Close()
				}
			}
		})
	}
	big, err := os.Create(filepath.Join(sub, "b1b1b1b1b1b1b1b1.json"))
	if err != nil {
		t.Fatal(err)
	}
	_ = big.Truncate(fleetsync.MaxFileSize + 1)
	big.Close()
	ahead, _ := json.Marshal(fleetsync.StorageFile{Version: 1, Instance: "a0a0a0a0a0a0a0a0", At: time.Now().Add(time.Hour).UnixNano()})
	if err := os.WriteFile(filepath.Join(sub, "a0a0a0a0a0a0a0a0.json"), ahead, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStorageFleetWriteFails: an instance that cannot write its file (the
// others do not see what it admits) admits its share of the limit, as when
// it cannot read.
func TestStorageFleetWriteFails(t *testing.T) {
	dir := t.TempDir()
	const every = 50 * time.Millisecond
	fleet := storageFleetOf(t, dir, 2, every, nil)
	own := filepath.Join(dir, "rate_limit", "sync", fleet[0].fleet.ID()+".json")
	if err := os.Remove(own); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(own, 0o700); err != nil { // its writes now fail (a rename onto a directory)
		t.Fatal(err)
	}
	time.Sleep(5 * every)
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 40, Period: time.Hour, Burst: 40}
	req := limiter.Request{Zone: "api", Key: "k", Policy: p, Cost: 1, Sync: 2 * every}.WithDigest(nil)
	if got := turns(fleet[:1], req, 300*time.Millisecond, time.Millisecond); got != 20 {
		t.Fatalf("an instance that cannot write admitted %d of 40, want its share, 20", got)
	}
}

// TestStorageFleetStopped: one of three flooded alone admits its share
// until refused; an instance that stops is no instance any more as soon
// as the others read its last file (the others' shares grow back), and
// what it admitted still counts: the two left admit the rest, exactly.
func TestStorageFleetStopped(t *testing.T) {
	const every = time.Second // a write or a read late by less than 3 of them is no failure, on a busy machine
	fleet := storageFleetOf(t, t.TempDir(), 3, every, nil)
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 30, Period: time.Hour, Burst: 30}
	req := limiter.Request{Zone: "api", Key: "k", Policy: p, Cost: 1, Sync: 2 * every}.WithDigest(nil)
	untilRefused := func(refused bool) bool { return refused }
	if got := turnsUntil(t, fleet[2:], req, time.Millisecond, "refused", untilRefused); got != 10 {
		t.Fatalf("one of three admitted %d of 30, want its share, 10", got)
	}
	fleet[2].Close()
	for deadline := time.Now().Add(10 * time.Second); fleet[0].fleet.Registered() != 2 || fleet[1].fleet.Registered() != 2; time.Sleep(every / 10) {
		if time.Now().After(deadline) {
			t.Fatalf("10 s after one of three stopped, the others count %d and %d instances, want 2",
				fleet[0].fleet.Registered(), fleet[1].fleet.Registered())
		}
	}
	spent := func(bool) bool { return fleet[0].fleet.Left(req) <= 0 && fleet[1].fleet.Left(req) <= 0 }
	if got := turnsUntil(t, fleet[:2], req, time.Millisecond, "spent in both views", spent); got != 20 {
		t.Errorf("the two left admitted %d more, want the 20 the stopped one left", got)
	}
}

// TestStorageFleetOwnerTurns: a limit under the instances' number (2 over
// 3: every request is over the share) is decided by the bucket's owner,
// which moves on with each window: a client whose requests all reach one
// instance gets the limit in a window of three, never more, never none.
func TestStorageFleetOwnerTurns(t *testing.T) {
	const every = time.Second // a write or a read late by less than 3 of them is no failure, on a busy machine
	fleet := storageFleetOf(t, t.TempDir(), 3, every, nil)
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 2, Period: 300 * time.Millisecond, Burst: 2}
	req := limiter.Request{Zone: "api", Key: "pinned", Policy: p, Cost: 1, Sync: 2 * every}.WithDigest(nil)
	start := time.Now()
	got := turns(fleet[:1], req, 3*time.Second, 5*time.Millisecond)
	windows := int64(time.Since(start)/(300*time.Millisecond)) + 1
	t.Logf("a client on one of three instances, 2 per 300 ms: %d admitted in %d windows", got, windows)
	if got < 2 || got > 2*(windows/3+1) {
		t.Fatalf("%d admitted in %d windows: want 2 in about one window of three", got, windows)
	}
}

// hookedStorage is a storage that is no FileSystem (the fleet lists and
// loads through it) and calls hook, once, before it loads the key hooked.
type hookedStorage struct {
	fleetsync.Storage
	hooked string
	hook   func()
	once   sync.Once
}

func (h *hookedStorage) Load(ctx context.Context, key string) ([]byte, error) {
	if key == h.hooked {
		h.once.Do(h.hook)
	}
	return h.Storage.Load(ctx, key)
}

// TestStorageFleetChargesDuringRead: what an instance admits while a read
// of the others' files runs, after the other's file it reads was written,
// is unseen by the other: the view that read puts in force counts it as
// the other's estimate too (the epoch ends when the read is put in force,
// not when it began).
func TestStorageFleetChargesDuringRead(t *testing.T) {
	st := &hookedStorage{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
	o := fleetsync.StorageOptions{WriteEvery: time.Hour, ReadEvery: time.Hour, Timeout: time.Minute} // no reads or writes but the test's
	a, b := newInstance(st, o), newInstance(st, o)
	defer a.Close()
	defer b.Close()
	a.fleet.Read(time.Minute) // a counts b
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 20, Period: time.Hour, Burst: 20}
	req := limiter.Request{Zone: "api", Key: "k", Policy: p, Cost: 1, Sync: time.Hour}.WithDigest(nil)
	admit := func(n int) {
		for range n {
			if _, refused := turn([]*instance{a}, req); refused {
				t.Errorf("a refused, its share of 20 not spent")
			}
		}
	}
	admit(2)
	st.hooked = b.fleet.File(b.fleet.ID())
	st.hook = func() { // as a reads: b writes (nothing admitted), then a admits 3
		b.fleet.Write(time.Minute, false)
		admit(3)
	}
	a.fleet.Read(time.Minute)
	d, err := a.Peek(context.Background(), req)
	if n := a.fleet.Registered(); err != nil || n != 2 || d.Remaining > 20-5-3 {
		t.Fatalf("a admitted 5, 3 of them after b's file it read was written: %d left in its view of %d instances (%v), want at most %d",
			d.Remaining, n, err, 20-5-3)
	}
}
