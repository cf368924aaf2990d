package e2e

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// TestSyncOvershootEndToEnd: three Caddy instances on one Redis Cluster,
// two zones of 100r/s (burst 100) that sync, every 100ms and every 1s; a
// client sends as fast as it can through all three for 20 seconds. Each
// zone admits no more than the stated bound: what the exact limit admits
// in the period, plus rate × sync, plus (N−1)/N of the burst and of
// rate × sync; and most of what the exact limit would. Each instance
// logs the bound for the three as it counts them.
func TestSyncOvershootEndToEnd(t *testing.T) {
	prefix := fmt.Sprintf("sync%d:", time.Now().UnixNano())
	zone := func(name, path, interval string) string {
		return fmt.Sprintf("\t\tzone %s {\n\t\t\tmatch {\n\t\t\t\tpath %s\n\t\t\t}\n\t\t\tkey {http.request.header.X-API-Key}\n\t\t\trate 100r/s\n\t\t\tsync %s\n\t\t}\n", name, path, interval)
	}
	site := "\trate_limit {\n" + redisBlock(prefix, redistest.ClusterAddrs(t)...) + zone("fast", "/fast", "100ms") + zone("slow", "/slow", "1s") + "\t}\n\trespond \"ok\"\n"
	var fleet []*testcaddy.Caddy
	for range 3 {
		fleet = append(fleet, testcaddy.Start(t, site))
	}
	const d = 20 * time.Second
	var admitted [2]atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for p, path := range []string{"/fast", "/slow"} {
		for w := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; time.Since(start) < d; i++ {
					if status(t, fleet[i%3].URL, path, "flood") == 200 {
						admitted[p].Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	took := time.Since(start).Seconds()
	for i, c := range fleet { // registered from their first requests: each counts the three
		if !strings.Contains(c.Logs(), `"zone":"fast","algorithm":"token_bucket","sync":0.1,"instances":3,"bound":84`) {
			t.Errorf("instance %d does not log the bound for 3 instances:\n%s", i, c.Logs())
		}
	}
	for p, interval := range []float64{0.1, 1} {
		exact := 100 + 100*took
		bound := exact + 100*interval + (100+100*interval)*2.0/3
		got := float64(admitted[p].Load())
		t.Logf("sync %.1fs: %.0f admitted in %.1fs; exact %.0f, bound %.0f", interval, got, took, exact, bound)
		if got > bound {
			t.Errorf("sync %.1fs: %.0f admitted, over the bound %.0f", interval, got, bound)
		}
		if got < 0.8*exact {
			t.Errorf("sync %.1fs: %.0f admitted, under 80%% of the exact %.0f", interval, got, exact)
		}
	}
}
