package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// TestDistributedHostileFiles: two Caddys share a storage directory, with
// a key_secret, while an attacker who can write the directory (not the
// secret) rewrites every instance's file with no counts every 50 ms (to
// lift the limit), adds 30 forged files of fresh instances (to squeeze
// it), and forges a file that charges one client's digest, read from the
// directory, 1,000 times (to lock that client out). One client at 40
// requests a second for 20 s through both, against 100 events a 10 s
// window: the fleet admits at most what one exact sliding window counter
// admits of the same arrivals plus the bound each Caddy logged, and most
// of what it admits.
func TestDistributedHostileFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	site := "\trate_limit {\n\t\tdistributed {\n\t\t\tread_interval 200ms\n\t\t\twrite_interval 200ms\n\t\t\tkey_secret e2e-fleet-secret-0123456789\n\t\t}\n" +
		"\t\tzone one {\n\t\t\tkey {http.request.header.X-Client}\n\t\t\tevents 100\n\t\t\twindow 10s\n\t\t}\n\t}\n\trespond \"ok\"\n"
	a := testcaddy.Start(t, site, "\tstorage file_system "+dir)
	b := testcaddy.Start(t, site, "\tstorage file_system "+dir)
	bound := 0.0
	for _, c := range []*testcaddy.Caddy{a, b} {
		logs := c.WaitLogs(`"zone syncs through the storage`)
		for line := range strings.SplitSeq(logs, "\n") {
			var l struct{ Bound float64 }
			if strings.Contains(line, `"zone syncs through the storage`) && json.Unmarshal([]byte(line), &l) == nil {
				bound = max(bound, l.Bound)
			}
		}
	}
	if bound <= 0 {
		t.Fatal("no bound logged")
	}
	time.Sleep(time.Second) // each reads the other's file
	stop := attackFiles(t, filepath.Join(dir, "rate_limit", "sync"))
	defer stop()
	ok, sent := 0, 0
	var at []time.Time
	start := time.Now()
	for i := 0; time.Since(start) < 20*time.Second; i++ {
		time.Sleep(time.Until(start.Add(time.Duration(i) * 25 * time.Millisecond)))
		at = append(at, time.Now())
		resp, _, err := []*testcaddy.Caddy{a, b}[i%2].Get("/", "X-Client", "victim")
		if err != nil {
			t.Fatal(err)
		}
		sent++
		if resp.StatusCode == 200 {
			ok++
		}
	}
	exact := float64(slidingWindowCounter(at, 100, 10*time.Second))
	t.Logf("%d of %d admitted in %s under attack; exact about %.0f, bound %.0f more", ok, sent, time.Since(start).Round(time.Millisecond), exact, bound)
	if float64(ok) > exact+bound {
		t.Errorf("%d admitted with the files rewritten and forged; want at most the exact %.0f plus the bound %.0f", ok, exact, bound)
	}
	if float64(ok) < 0.6*exact {
		t.Errorf("%d admitted; want most of the exact %.0f: forged files squeezed or locked the client out", ok, exact)
	}
}

// attackFiles rewrites, every 50 ms until stop, each instance's file in
// dir with no counts, writes 30 forged instances' files, and one that
// charges every digest read from the instances' files 1,000 times.
func attackFiles(t *testing.T, dir string) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	var once sync.Once
	go func() {
		defer close(ended)
		var digests []string
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			now := time.Now().UnixNano()
			files, _ := filepath.Glob(filepath.Join(dir, "????????????????.json"))
			for _, f := range files {
				digests = append(digests, digestsIn(f)...)
				inst := strings.TrimSuffix(filepath.Base(f), ".json")
				if strings.HasPrefix(inst, "ffff") {
					continue // a forged one
				}
				writeFile(f, fmt.Sprintf(`{"v":1,"instance":%q,"at":%d,"until":%d,"buckets":[]}`, inst, now, now+int64(20*time.Second)))
			}
			for i := range 30 {
				inst := fmt.Sprintf("ffff%012x", i)
				buckets := "[]"
				if i == 0 && len(digests) > 0 {
					d := digests[rand.IntN(len(digests))]
					buckets = fmt.Sprintf(`[{"z":"one","a":"sliding_window_counter","k":%q,"w":10000000000,"s":%d,"c":1000,"p":1000}]`, d, now/1e10*1e10)
				}
				writeFile(filepath.Join(dir, inst+".json"), fmt.Sprintf(`{"v":1,"instance":%q,"at":%d,"until":%d,"buckets":%s}`, inst, now, now+int64(20*time.Second), buckets))
			}
		}
	}()
	return func() { once.Do(func() { close(done) }); <-ended }
}

// digestsIn is the digests counted in an instance's file.
func digestsIn(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var f struct{ Buckets []struct{ K string } }
	if json.Unmarshal(b, &f) != nil {
		return nil
	}
	var ds []string
	for _, c := range f.Buckets {
		ds = append(ds, c.K)
	}
	return ds
}

// writeFile replaces path with content, as an instance does (a rename).
func writeFile(path, content string) {
	tmp := path + ".tmp"
	if os.WriteFile(tmp, []byte(content), 0o644) == nil {
		_ = os.Rename(tmp, path)
	}
}

// slidingWindowCounter is how many of the arrivals at a counter of limit
// a window admits: windows start at multiples of window (Unix time), and
// a request passes when the previous window's count, weighted by how
// much of it the sliding window still covers, plus the current one's,
// stays within limit.
func slidingWindowCounter(at []time.Time, limit int, window time.Duration) int {
	var start int64 = -1
	prev, curr, admitted := 0.0, 0.0, 0
	for _, t := range at {
		w := t.UnixNano() / int64(window)
		switch {
		case start == -1:
			start = w
		case w == start+1:
			prev, curr, start = curr, 0, w
		case w > start+1:
			prev, curr, start = 0, 0, w
		}
		elapsed := float64(t.UnixNano()-w*int64(window)) / float64(window)
		if prev*(1-elapsed)+curr+1 <= float64(limit)+1e-9 {
			curr++
			admitted++
		}
	}
	return admitted
}
