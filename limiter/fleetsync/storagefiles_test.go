package fleetsync_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
)

// filesFleet is n Limiters sharing Caddy's file system storage at dir
// (telling sizes, as the handler's storage does), with o, each having read
// the others' first files.
func filesFleet(t *testing.T, dir string, n int, o fleetsync.StorageOptions) []*instance {
	t.Helper()
	var fleet []*instance
	for range n {
		l := newInstance(sizedFileStorage{&certmagic.FileStorage{Path: dir}}, o)
		t.Cleanup(func() { l.Close() })
		fleet = append(fleet, l)
	}
	for _, l := range fleet {
		l.fleet.Read(time.Second)
		l.CountSync(context.Background(), o.ReadEvery)
	}
	return fleet
}

// syncDir makes dir's rate_limit/sync and returns it.
func syncDir(t *testing.T, dir string) string {
	t.Helper()
	sub := filepath.Join(dir, "rate_limit", "sync")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	return sub
}

// writeInstance writes, in sub, the file of an instance named name that
// was written at at, until until, with buckets buckets of another zone.
func writeInstance(t *testing.T, sub, name string, at, until time.Time, buckets int) {
	t.Helper()
	file := fleetsync.StorageFile{Version: 1, Instance: name, At: at.UnixNano(), Until: until.UnixNano()}
	for range buckets {
		var h [16]byte
		_, _ = rand.Read(h[:])
		file.Buckets = append(file.Buckets, fleetsync.StorageCounts{Zone: "other", Algo: "fixed_window", Digest: hex.EncodeToString(h[:]),
			Period: int64(time.Hour), Start: at.Truncate(time.Hour).UnixNano(), Curr: 1})
	}
	b, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(sub, name+".json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, at, at); err != nil {
		t.Fatal(err)
	}
}

// skips counts the reports of name.
func (r *recordedStorage) skips(name string) (n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.skipped {
		if s == name {
			n++
		}
	}
	return n
}

// hourOf100 is a request of a window of 100 an hour, synced every 100 ms.
var hourOf100 = limiter.Request{Zone: "api", Key: "k", Policy: limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 100, Period: time.Hour, Burst: 100},
	Cost: 1, Sync: 100 * time.Millisecond}.WithDigest(nil)

// seesAll fails unless, within 10 s, every instance of fleet counts the
// admitted of req's bucket: the others' files were read.
func seesAll(t *testing.T, fleet []*instance, req limiter.Request, admitted int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		all := true
		for _, l := range fleet {
			all = all && l.fleet.Left(req) == req.Policy.Rate-admitted
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	for i, l := range fleet {
		if left := l.fleet.Left(req); left != req.Policy.Rate-admitted {
			t.Errorf("instance %d sees %d left of %d, 10 s after %d admitted", i, left, req.Policy.Rate, admitted)
		}
	}
}

// TestStorageFilesDevices: a file of the directory that is a symlink to
// /dev/zero (an endless read), or to a FIFO (a read that never starts), is
// skipped at once and reported once by each instance: neither takes the
// instances' memory nor holds their start, and the two instances count
// each other.
func TestStorageFilesDevices(t *testing.T) {
	dir := t.TempDir()
	sub := syncDir(t, dir)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	defer func() { // let a read that waits on it end
		for range 2 {
			if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
		}
	}()
	for name, to := range map[string]string{"00000000000000aa.json": "/dev/zero", "00000000000000bb.json": fifo} {
		if err := os.Symlink(to, filepath.Join(sub, name)); err != nil {
			t.Fatal(err)
		}
	}
	ev := &recordedStorage{}
	start := time.Now()
	fleet := filesFleet(t, dir, 2, fleetsync.StorageOptions{WriteEvery: 50 * time.Millisecond, ReadEvery: 50 * time.Millisecond, Timeout: time.Second, Events: ev})
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("two instances took %s to start", took)
	}
	time.Sleep(300 * time.Millisecond)
	if n := fleet[0].fleet.Registered(); n != 2 {
		t.Errorf("an instance counts %d instances, want 2", n)
	}
	for _, name := range []string{"00000000000000aa.json", "00000000000000bb.json"} {
		if n := ev.skips(name); n != 2 {
			t.Errorf("%s reported %d times, want once per instance", name, n)
		}
	}
}

// TestStorageFilesLinkedDir: rate_limit/sync a symlink to a directory
// (sharing only that directory) is followed: the instances count each
// other, and two admit no more than the limit and the bound of a sync.
func TestStorageFilesLinkedDir(t *testing.T) {
	dir, shared := t.TempDir(), t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "rate_limit"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(shared, filepath.Join(dir, "rate_limit", "sync")); err != nil {
		t.Fatal(err)
	}
	const every = time.Second // a write or a read late by less than 3 of them is no failure, on a busy machine
	fleet := filesFleet(t, dir, 2, fleetsync.StorageOptions{WriteEvery: every, ReadEvery: every})
	if n := fleet[0].fleet.Registered(); n != 2 {
		t.Errorf("an instance counts %d instances, want 2", n)
	}
	admitted := turns(fleet, hourOf100, 600*time.Millisecond, time.Millisecond)
	if admitted > 150 { // the bound: (N-1)/N of the window
		t.Errorf("two instances admitted %d of a window of 100", admitted)
	}
	seesAll(t, fleet, hourOf100, admitted)
	if files, _ := filepath.Glob(filepath.Join(shared, "*.json")); len(files) != 2 {
		t.Errorf("the shared directory holds %v: want one file per instance", files)
	}
}

// TestStorageFilesManyInstances: 300 small files that look like instances'
// (named as the fleet names them, written now) are counted up to
// fleetsync.MaxStorageInstances, the surplus reported once by each
// instance: shares do not shrink to nothing, some requests are admitted.
// Files not named as the fleet names them are no instances at all.
func TestStorageFilesManyInstances(t *testing.T) {
	const every = 50 * time.Millisecond
	for _, c := range []struct {
		name   string
		format string
		want   int64
	}{{"fleet names", "%016x", fleetsync.MaxStorageInstances}, {"other names", "x%d", 2}} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			sub := syncDir(t, dir)
			for i := range 300 {
				writeInstance(t, sub, fmt.Sprintf(c.format, i+1), time.Now(), time.Now(), 0)
			}
			ev := &recordedStorage{}
			fleet := filesFleet(t, dir, 2, fleetsync.StorageOptions{WriteEvery: every, ReadEvery: every, Events: ev})
			if n := fleet[0].fleet.Registered(); n != c.want {
				t.Errorf("an instance counts %d instances, want %d", n, c.want)
			}
			admitted := turns(fleet, hourOf100, 600*time.Millisecond, time.Millisecond)
			t.Logf("%d admitted of a window of 100", admitted)
			if admitted == 0 || admitted > 150 {
				t.Errorf("two instances admitted %d of a window of 100", admitted)
			}
			if n := ev.skips("rate_limit/sync"); c.want == fleetsync.MaxStorageInstances && n != 2 {
				t.Errorf("the surplus of instances reported %d times, want once per instance", n)
			}
		})
	}
}

// TestStorageFilesOversized: a file of more buckets than all the others'
// files may hold (written an hour ago, its counts lasting an hour more),
// named to be read first, is skipped, reported once, and the instances'
// own files are read: two admit no more than the limit and the bound.
func TestStorageFilesOversized(t *testing.T) {
	dir := t.TempDir()
	sub := syncDir(t, dir)
	writeInstance(t, sub, "0000000000000000", time.Now().Add(-time.Hour), time.Now().Add(time.Hour), 1000)
	ev := &recordedStorage{}
	// Reads every second: at 50 ms a loaded machine's slow read of the
	// oversized file made the others' counts stale (three intervals), and
	// each instance then admitted its local share beyond its allowance
	// (192 of 100 was seen).
	const every = time.Second
	fleet := filesFleet(t, dir, 2, fleetsync.StorageOptions{WriteEvery: every, ReadEvery: every, Events: ev, MaxEntries: 1000})
	admitted := turns(fleet, hourOf100, 2500*time.Millisecond, time.Millisecond)
	if admitted > 150 || admitted < 50 {
		t.Errorf("two instances admitted %d of a window of 100", admitted)
	}
	seesAll(t, fleet, hourOf100, admitted)
	if n := fleet[0].fleet.Registered(); n != 2 {
		t.Errorf("an instance counts %d instances, want 2", n)
	}
	if n := ev.skips("0000000000000000.json"); n != 2 {
		t.Errorf("the oversized file reported %d times, want once per instance", n)
	}
}

// TestStorageFilesSwapped: a file replaced by a FIFO or a symlink between
// the listing and the read is not opened as one: the read returns at
// once with an error, and holds no thread.
func TestStorageFilesSwapped(t *testing.T) {
	dir := t.TempDir()
	fifo, link := filepath.Join(dir, "fifo.json"), filepath.Join(dir, "link.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, link} {
		done := make(chan error, 1)
		go func() { _, err := fleetsync.ReadRegular(p, 1<<20); done <- err }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("%s read as a file", filepath.Base(p))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("reading %s blocks", filepath.Base(p))
		}
	}
}

// TestStorageFilesAhead: a file dated ahead of the clock (its write time
// in 2099) is no instance: it neither counts nor stays on top of those
// that count.
func TestStorageFilesAhead(t *testing.T) {
	dir := t.TempDir()
	sub := syncDir(t, dir)
	future := time.Now().Add(100 * 365 * 24 * time.Hour)
	for i := range 3 {
		name := fmt.Sprintf("%016x", 0xf00d+i)
		writeInstance(t, sub, name, time.Now(), time.Now().Add(time.Hour), 1)
		if err := os.Chtimes(filepath.Join(sub, name+".json"), future, future); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filepath.Join(sub, name+".json"), fleetsync.MaxFileSize+1); err != nil { // sparse: skipped for its size, counted by its time
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(sub, name+".json"), future, future); err != nil {
			t.Fatal(err)
		}
	}
	fleet := filesFleet(t, dir, 1, fleetsync.StorageOptions{WriteEvery: time.Second, ReadEvery: time.Second})
	if n := fleet[0].Instances(); n != 1 {
		t.Fatalf("an instance alone with 3 files dated 2099 counts %d instances, want 1", n)
	}
}

// TestStorageFilesTooLargeCounted: an instance's file too large to be
// read at all (past maxFileSize: a million buckets of a long zone name)
// still counts its instance, blind, when it was written lately: the
// fleet is not split by it.
func TestStorageFilesTooLargeCounted(t *testing.T) {
	dir := t.TempDir()
	sub := syncDir(t, dir)
	name := fmt.Sprintf("%016x", 0xbeef)
	writeInstance(t, sub, name, time.Now(), time.Now().Add(time.Hour), 1)
	if err := os.Truncate(filepath.Join(sub, name+".json"), fleetsync.MaxFileSize+1); err != nil { // sparse
		t.Fatal(err)
	}
	fleet := filesFleet(t, dir, 1, fleetsync.StorageOptions{WriteEvery: time.Second, ReadEvery: time.Second})
	if n := fleet[0].Instances(); n != 2 {
		t.Fatalf("an instance beside another whose file is too large to read counts %d instances, want 2", n)
	}
}

// TestStorageFleetTellsInstances: an instance of a storage fleet tells
// when the instances it counts change, as a Redis fleet's does (the
// handler logs the bound again).
func TestStorageFleetTellsInstances(t *testing.T) {
	dir := t.TempDir()
	fleet := filesFleet(t, dir, 1, fleetsync.StorageOptions{WriteEvery: 50 * time.Millisecond, ReadEvery: 50 * time.Millisecond})
	told := &syncRounds{}
	fleet[0].sync.OnEvents(told)
	fleet = append(fleet, filesFleet(t, dir, 1, fleetsync.StorageOptions{WriteEvery: 50 * time.Millisecond, ReadEvery: 50 * time.Millisecond})...)
	p := limiter.Policy{Algorithm: limiter.FixedWindow, Rate: 100, Period: time.Minute, Burst: 100}
	req := limiter.Request{Zone: "told", Key: "k", Policy: p, Cost: 1, Sync: 100 * time.Millisecond}.WithDigest(nil)
	var v limiter.Verdict
	for end := time.Now().Add(5 * time.Second); told.instances.Load() != 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the first instance told %d instances, want 2", told.instances.Load())
		}
		fleet[0].Decide(context.Background(), time.Time{}, []limiter.Request{req}, limiter.Caller{}, &v)
		v.Release()
	}
}
