package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/compatconfigs"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// TestCompatDistributed: caddy-ratelimit's README Caddyfile example,
// distributed included, its site body unchanged, on two Caddys whose
// global storage is one directory, as its README describes ("two or more
// instances sharing the same storage module ... act approximately as one
// instance"). Each instance logs the bound of each zone. Once each has
// read the other's file: one client (dynamic_example, 2 in 5 s per
// address) sending through both gets 2 in all, not 2 from each; 150
// clients sending GETs through both get static_example's 100 a minute
// between them, within the stated bound, and no instance admits the whole
// 100 on its own. The files hold no client address. With a redis block
// added, the same through Redis.
func TestCompatDistributed(t *testing.T) {
	t.Parallel()
	_, site, _ := strings.Cut(compatconfigs.ReadmeCaddyfile, ":80\n")
	t.Run("storage", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		testDistributed(t, site, "\tstorage file_system "+dir, `"zone syncs through the storage`, 10, dir)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		// A timeout of seconds: a round or a decision that waits out
		// the default 100 ms on a loaded machine is a Redis failure, and
		// each instance then admits its local share beyond its allowance
		// (on_store_error local), which this test is not about.
		redis := fmt.Sprintf("\tredis {\n\t\taddresses %s\n\t\tkey_prefix compat%d:\n\t\ttimeout 5s\n\t}\n", redistest.StandaloneAddr(t), time.Now().UnixNano())
		testDistributed(t, strings.Replace(site, "\tdistributed\n", "\tdistributed\n"+redis, 1), "", `"zone syncs with Redis`, 5, "")
	})
}

// testDistributed runs TestCompatDistributed's checks on two Caddys of
// site with globals, which log synced and a sync of syncSeconds; dir is
// the storage's directory ("" for Redis).
func testDistributed(t *testing.T, site, globals, synced string, syncSeconds float64, dir string) {
	a := testcaddy.Start(t, site, globals)
	b := testcaddy.Start(t, site, globals)
	for _, c := range []*testcaddy.Caddy{a, b} {
		line := c.WaitLogs(synced)
		if !strings.Contains(line, fmt.Sprintf(`"zone":"static_example","algorithm":"sliding_window_counter","sync":%g`, syncSeconds)) {
			t.Fatalf("no bound logged for static_example:\n%s", line)
		}
	}
	time.Sleep(5500 * time.Millisecond) // the first instance reads the second's file (read_interval 5s)

	one := 0
	for i := range 8 {
		if fromAddr(t, "127.0.2.1", []*testcaddy.Caddy{a, b}[i%2]) {
			one++
		}
	}
	if one != 2 {
		t.Fatalf("one client sending 8 requests through both instances got %d admitted; want dynamic_example's 2 (1 from each)", one)
	}

	admitted := burstAfterWrite(t, a, b, dir)
	total := admitted[a] + admitted[b]
	// rate × sync + (N − 1) / N × (burst + rate × sync): 100/60 a second, burst 100, N = 2
	bound := 100 + 100.0/60*syncSeconds + 0.5*(100+100.0/60*syncSeconds)
	t.Logf("static_example, 100 a minute: %d + %d admitted from 150 clients through the two instances; bound %.0f", admitted[a], admitted[b], bound)
	if float64(total) > bound-2 || total < 90 { // the first client's 2 counted too
		t.Fatalf("%d admitted in all: want about 98, at most %.0f (%s)", total, bound-2, syncErrors(t, a, b))
	}
	if admitted[a] >= 100 || admitted[b] >= 100 {
		t.Fatalf("an instance admitted the whole limit alone (%d, %d): not shared (%s)", admitted[a], admitted[b], syncErrors(t, a, b))
	}
	// Two syncs later, each instance has read what the other admitted:
	// the minute's 100 are spent (the sliding counter lets back a part of
	// them as the minute goes by, 1/60 of them a second).
	time.Sleep(time.Duration(2*syncSeconds+1) * time.Second)
	more := burst(t, "127.0.3.%d", a, b)
	t.Logf("two syncs later: %d + %d more admitted", more[a], more[b])
	if fade := 100 * (2*syncSeconds + 6) / 60; float64(more[a]+more[b]) > fade {
		t.Fatalf("%d + %d more admitted two syncs later from a minute's 100 spent; want at most what faded, %.0f: "+
			"the instances do not see each other's counts", more[a], more[b], fade)
	}
	if dir != "" {
		checkStorage(t, a, dir)
	}
}

// syncErrors tells the rounds that failed on a and b and the requests
// on_store_error decided: a failed round makes an instance admit its
// local share.
func syncErrors(t *testing.T, a, b *testcaddy.Caddy) string {
	var out []string
	for i, c := range []*testcaddy.Caddy{a, b} {
		out = append(out, fmt.Sprintf("instance %d: %v rounds failed, %v decided by on_store_error", i,
			scrape(t, c, `caddy_rate_limit_syncs_total{result="error"}`),
			scrape(t, c, `caddy_rate_limit_decisions_total{result="store_error",zone="static_example"}`)))
	}
	return strings.Join(out, "; ")
}

// checkStorage checks, after TestCompatDistributed's bursts through the
// storage dir, that a's /metrics count its reads, and that dir holds one
// file per instance, no client address, and one digest of static_example's
// bucket.
func checkStorage(t *testing.T, a *testcaddy.Caddy, dir string) {
	t.Helper()
	resp, err := http.Get(a.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `caddy_rate_limit_syncs_total{result="ok"}`) {
		t.Errorf("/metrics counts no read of the storage as a sync")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "rate_limit", "sync", "*.json"))
	if len(files) != 2 {
		t.Fatalf("the storage holds %v: want one file per instance", files)
	}
	digests := map[string]bool{} // static_example's one bucket, as each instance names it
	for _, f := range files {
		body, _ := os.ReadFile(f)
		if strings.Contains(string(body), "127.0.") {
			t.Fatalf("%s holds a client address: %s", f, body)
		}
		var file struct {
			Buckets []struct{ Z, K string }
		}
		if err := json.Unmarshal(body, &file); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, b := range file.Buckets {
			if b.Z == "static_example" {
				digests[b.K] = true
			}
		}
	}
	if len(digests) != 1 {
		t.Fatalf("the instances name static_example's one bucket by %d digests (%v): they cannot add up each other's counts", len(digests), digests)
	}
}

// burstAfterWrite is burst from 127.0.1.x through a and b; through the
// storage dir, it starts as an instance writes (see nextWrite).
func burstAfterWrite(t *testing.T, a, b *testcaddy.Caddy, dir string) map[*testcaddy.Caddy]int {
	t.Helper()
	if dir == "" {
		return burst(t, "127.0.1.%d", a, b)
	}
	wrote := nextWrite(t, dir)
	admitted := burst(t, "127.0.1.%d", a, b)
	t.Logf("the burst ended %s after an instance's write (its next write and read: 5 s after it)", time.Since(wrote).Round(time.Millisecond))
	return admitted
}

// nextWrite waits for an instance's next write of its file in dir's
// rate_limit/sync, and returns when it was written (its "at"). An instance
// writes and reads at the same ticks, 5 s apart (write_interval and
// read_interval). What one instance admits reaches the other at its write
// then the other's read; a read, mid-burst, that shows the other's share
// spent leaves the reader a share of what is left less its own admissions
// since that write (their estimate of what the other admitted unseen):
// half the rest, the other half at later syncs (73 of 98 admitted, not a
// failure to share). A burst that starts once an instance has written and
// ends within 5 s of that write holds no such read: that instance reads
// next 5 s after it (and writes then what it admitted, which the other
// reads later still); until then the other reads only its file written
// before the burst. Each instance admits its share of what was left.
func nextWrite(t *testing.T, dir string) time.Time {
	t.Helper()
	before := writes(dir)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for name, at := range writes(dir) {
			if at.After(before[name]) {
				return at
			}
		}
	}
	t.Fatalf("no instance wrote its file in %s within 20 s", dir)
	return time.Time{}
}

// writes is when each instance's file in dir's rate_limit/sync was
// written, as it says.
func writes(dir string) map[string]time.Time {
	files, _ := filepath.Glob(filepath.Join(dir, "rate_limit", "sync", "*.json"))
	at := map[string]time.Time{}
	for _, f := range files {
		var file struct {
			At int64 `json:"at"`
		}
		if body, err := os.ReadFile(f); err == nil && json.Unmarshal(body, &file) == nil {
			at[f] = time.Unix(0, file.At)
		}
	}
	return at
}

// burst sends 3 GETs from each of 150 loopback addresses (addr with %d,
// from 1), through a and b in turn, and counts those each admitted.
func burst(t *testing.T, addr string, a, b *testcaddy.Caddy) map[*testcaddy.Caddy]int {
	var mu sync.Mutex
	admitted := map[*testcaddy.Caddy]int{}
	var wg sync.WaitGroup
	for i := range 150 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 3 {
				c := []*testcaddy.Caddy{a, b}[(i+j)%2]
				if fromAddr(t, fmt.Sprintf(addr, i+1), c) {
					mu.Lock()
					admitted[c]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return admitted
}

// fromAddr sends a GET to c from the loopback address addr, and reports
// whether it was admitted (200; a 429 is a refusal, anything else fails
// the test).
func fromAddr(t *testing.T, addr string, c *testcaddy.Caddy) bool {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(addr)}, Timeout: 5 * time.Second}
	client := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Get(c.URL + "/")
	if err != nil {
		t.Errorf("GET from %s: %v", addr, err)
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("GET from %s: %s", addr, resp.Status)
	}
	return resp.StatusCode == http.StatusOK
}
