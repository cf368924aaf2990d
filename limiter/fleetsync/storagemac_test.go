package fleetsync_test

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
)

// fleetSecret is the fleet's secret in these tests.
const fleetSecret = "0123456789abcdef-fleet"

// macPair is two instances sharing dir, signing with secret ("": none),
// that read and write only when the test says; b's storage events go to
// ev. Each counts the other.
func macPair(t *testing.T, dir, secret string, ev fleetsync.StorageEvents) (a, b *instance) {
	t.Helper()
	o := fleetsync.StorageOptions{WriteEvery: time.Hour, ReadEvery: time.Hour, Timeout: time.Minute, Secret: secret}
	st := sizedFileStorage{&certmagic.FileStorage{Path: dir}}
	a = newInstance(st, o)
	o.Events = ev
	b = newInstance(st, o)
	t.Cleanup(func() { a.Close(); b.Close() })
	a.fleet.Read(time.Minute)
	if a.fleet.Registered() != 2 || b.fleet.Registered() != 2 {
		t.Fatalf("the instances count %d and %d instances, want 2", a.fleet.Registered(), b.fleet.Registered())
	}
	return a, b
}

// admitTo has a admit n of req's bucket (refused: fails t), until a's
// own view counts total, then writes a's file and has b read it.
func admitTo(t *testing.T, a, b *instance, req limiter.Request, n, total int64) {
	t.Helper()
	for range n {
		if _, refused := turn([]*instance{a}, req); refused {
			t.Fatalf("a refused a request within its share")
		}
	}
	seesAll(t, []*instance{a}, req, total)
	a.fleet.Write(time.Minute, false)
	b.fleet.Read(time.Minute)
}

// forge writes, in sub, a file named name holding file, unsigned, or with
// a made-up MAC when mac.
func forge(t *testing.T, sub, name string, file fleetsync.StorageFile, mac bool) {
	t.Helper()
	b, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	if mac {
		b = append(b[:len(b)-1], fmt.Sprintf(`,"mac":%q}`, hex.EncodeToString(make([]byte, 32)))...)
	}
	if err := os.WriteFile(filepath.Join(sub, name+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStorageMACAttacks: whoever can write the fleet's directory, without
// the secret, (1) rewrites an instance's file with no counts (a lift:
// what it admitted unseen), (2) lays 62 files of instances written now (a
// squeeze: 64 instances share the limit), (3) lays a file counting a
// client's bucket full (the client refused everywhere). Without a secret
// each works, as the docs say; with one, the files are ignored, each
// reported once, and no file lifts or squeezes: the other instance counts
// a's 40 and, a's file hidden by the forged one, a blind (its share, 50,
// taken as spent), and admits what that leaves.
func TestStorageMACAttacks(t *testing.T) {
	for _, secret := range []string{"", fleetSecret} {
		t.Run(fmt.Sprintf("secret %v", secret != ""), func(t *testing.T) {
			dir, ev := t.TempDir(), &recordedStorage{}
			sub := filepath.Join(dir, "rate_limit", "sync")
			a, b := macPair(t, dir, secret, ev)
			req := hourOf100
			admitTo(t, a, b, req, 40, 40)
			seesAll(t, []*instance{b}, req, 40)
			now := time.Now()
			forge(t, sub, a.fleet.ID(), fleetsync.StorageFile{Version: 1, Instance: a.fleet.ID(), At: now.UnixNano(), Until: now.Add(time.Hour).UnixNano()}, true) // (1)
			var squeeze []string
			for i := range 62 { // (2)
				squeeze = append(squeeze, fmt.Sprintf("%016x", 0x5e0000+i))
				writeInstance(t, sub, squeeze[i], now, now.Add(time.Hour), 0)
			}
			h := req.Digest()
			lockout := fleetsync.StorageFile{Version: 1, Instance: "00000000c0ffee00", At: now.UnixNano(), Until: now.Add(time.Hour).UnixNano(),
				Buckets: []fleetsync.StorageCounts{{Zone: req.Zone, Algo: req.Policy.Algorithm.String(), Digest: hex.EncodeToString(h[:]),
					Period: int64(req.Policy.Period), Start: now.Truncate(req.Policy.Period).UnixNano(), Curr: 1 << 40}}}
			forge(t, sub, lockout.Instance, lockout, false) // (3)
			b.fleet.Read(time.Minute)
			b.fleet.Read(time.Minute)
			n, left := b.fleet.Registered(), b.fleet.Left(req)
			_, refused := turn([]*instance{b}, req)
			if secret == "" {
				if n != 64 || left > 0 || !refused {
					t.Fatalf("without a secret: b counts %d instances, %d left, refused %v: want the attacks to work (64, none left, refused)", n, left, refused)
				}
				return
			}
			if n != 2 || left != 10 || refused {
				t.Fatalf("with a secret: b counts %d instances, %d left, refused %v: want 2, 10 (a's 40 counted, its share spent), admitted", n, left, refused)
			}
			for _, name := range append(squeeze, a.fleet.ID(), lockout.Instance) {
				if got := ev.skips(name + ".json"); got != 1 {
					t.Fatalf("%s.json reported %d times, want once", name, got)
				}
			}
		})
	}
}

// TestStorageMACLiftAlone: a's file rewritten with no counts, and nothing
// else: without a secret, b no longer sees what a admitted; with one, it
// still does (a's last signed file stands in for it), and counts a blind
// (its share taken as spent: what it admitted since is unseen).
func TestStorageMACLiftAlone(t *testing.T) {
	for _, secret := range []string{"", fleetSecret} {
		dir := t.TempDir()
		a, b := macPair(t, dir, secret, nil)
		admitTo(t, a, b, hourOf100, 40, 40)
		now := time.Now()
		forge(t, filepath.Join(dir, "rate_limit", "sync"), a.fleet.ID(),
			fleetsync.StorageFile{Version: 1, Instance: a.fleet.ID(), At: now.UnixNano(), Until: now.UnixNano()}, false)
		b.fleet.Read(time.Minute)
		want := map[bool]int64{false: 100, true: 10}[secret != ""]
		if left := b.fleet.Left(hourOf100); left != want || b.fleet.Registered() != 2 {
			t.Errorf("secret %v: after a's file was rewritten empty, b sees %d left of 100 and %d instances, want %d and 2",
				secret != "", left, b.fleet.Registered(), want)
		}
	}
}

// TestStorageMACReplayAndCopy: with a secret, a's older signed file put
// back over its current one (fewer counts) is ignored, reported once, and
// b keeps a's latest counts, a blind (its share spent) until it reads a's
// next file; a's current signed file copied under another instance's name
// (its counts twice, an instance more) is ignored.
func TestStorageMACReplayAndCopy(t *testing.T) {
	dir, ev := t.TempDir(), &recordedStorage{}
	sub := filepath.Join(dir, "rate_limit", "sync")
	a, b := macPair(t, dir, fleetSecret, ev)
	own := filepath.Join(sub, a.fleet.ID()+".json")
	admitTo(t, a, b, hourOf100, 10, 10)
	older, err := os.ReadFile(own)
	if err != nil {
		t.Fatal(err)
	}
	admitTo(t, a, b, hourOf100, 30, 40)
	current, err := os.ReadFile(own)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(own, older, 0o600); err != nil { // the replay
		t.Fatal(err)
	}
	copied := "c0c0c0c0c0c0c0c0.json"
	if err := os.WriteFile(filepath.Join(sub, copied), current, 0o600); err != nil { // the copy
		t.Fatal(err)
	}
	b.fleet.Read(time.Minute)
	b.fleet.Read(time.Minute)
	if left, n := b.fleet.Left(hourOf100), b.fleet.Registered(); left != 10 || n != 2 {
		t.Fatalf("after a replay and a copy of a's files, b sees %d left of 100 and %d instances, want 10 (a's 40 and its share) and 2", left, n)
	}
	for _, name := range []string{a.fleet.ID() + ".json", copied} {
		if got := ev.skips(name); got != 1 {
			t.Errorf("%s reported %d times, want once", name, got)
		}
	}
	admitTo(t, a, b, hourOf100, 5, 45) // a writes again: read as before
	if left := b.fleet.Left(hourOf100); left != 55 {
		t.Fatalf("after a wrote again, b sees %d left, want 55", left)
	}
}

// TestStorageMACUnsigned: with a secret, a file of the fleet's own format
// not signed with it (an instance without the secret, or with another) is
// no instance, not even a blind one: it is reported once and its counts
// are not read.
func TestStorageMACUnsigned(t *testing.T) {
	dir, ev := t.TempDir(), &recordedStorage{}
	sub := syncDir(t, dir)
	other := newInstance(sizedFileStorage{&certmagic.FileStorage{Path: dir}}, fleetsync.StorageOptions{WriteEvery: time.Hour, ReadEvery: time.Hour, Secret: "another secret, 16+"})
	t.Cleanup(func() { other.Close() })
	writeInstance(t, sub, "00000000000000aa", time.Now(), time.Now().Add(time.Hour), 1)
	writeInstance(t, sub, "00000000000000bb", time.Now(), time.Now().Add(time.Hour), 1)
	if err := os.Truncate(filepath.Join(sub, "00000000000000bb.json"), fleetsync.MaxFileSize+1); err != nil { // too large to read: no blind instance
		t.Fatal(err)
	}
	_, b := macPair(t, dir, fleetSecret, ev)
	b.fleet.Read(time.Minute)
	if n := b.fleet.Registered(); n != 2 {
		t.Errorf("b counts %d instances, want 2 (itself and a)", n)
	}
	for _, name := range []string{other.fleet.ID() + ".json", "00000000000000aa.json", "00000000000000bb.json"} {
		if got := ev.skips(name); got != 1 {
			t.Errorf("%s reported %d times, want once", name, got)
		}
	}
}

// TestStorageMACFleet: two instances with a secret, writing and reading
// every 50 ms, count each other and share a window as without one: no
// more than the limit and the bound, and each sees what the other
// admitted; their files are signed.
func TestStorageMACFleet(t *testing.T) {
	dir, ev := t.TempDir(), &recordedStorage{}
	const every = 50 * time.Millisecond
	fleet := filesFleet(t, dir, 2, fleetsync.StorageOptions{WriteEvery: every, ReadEvery: every, Events: ev, Secret: fleetSecret})
	if n := fleet[0].fleet.Registered(); n != 2 {
		t.Fatalf("an instance counts %d instances, want 2", n)
	}
	admitted := turns(fleet, hourOf100, 600*time.Millisecond, time.Millisecond)
	if admitted < 50 || admitted > 150 { // the bound: (N-1)/N of the window
		t.Errorf("two instances admitted %d of a window of 100", admitted)
	}
	seesAll(t, fleet, hourOf100, admitted)
	b, err := os.ReadFile(filepath.Join(dir, "rate_limit", "sync", fleet[0].fleet.ID()+".json"))
	if err != nil || !strings.Contains(string(b), `"mac":"`) {
		t.Errorf("an instance's file %s (%v): want it signed", b, err)
	}
	if ev.mu.Lock(); len(ev.skipped) != 0 {
		t.Errorf("skipped %v, want none", ev.skipped)
	}
	ev.mu.Unlock()
}
