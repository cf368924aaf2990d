package e2e

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// The chaos suite: real Redis processes killed, hung, restarted, paused
// and flushed under load through a real Caddy, and reloads under load.
// Every case asserts exact limits before and after, and logs what it
// measured (BENCHMARKS.md quotes these lines).

// chaosTimeout is the Redis timeout of chaosSite.
const chaosTimeout = 100 * time.Millisecond

// chaosSite is a Caddy site on Redis (addrs) with a 100ms timeout that
// fails closed with 503, so that a decision left to the failure mode shows
// as 503: /load never refuses (a huge burst), /exact allows 5 per key.
func chaosSite(prefix string, addrs ...string) string {
	return fmt.Sprintf(`	rate_limit {
		redis {
			addresses  %s
			key_prefix %s
			timeout    %s
			local_cache off
		}
		on_store_error deny 503
		zone load {
			match {
				path /load
			}
			key   {http.request.header.X-API-Key}
			rate  1000r/s
			burst 1000000
		}
		zone exact {
			match {
				path /exact
			}
			key   {http.request.header.X-API-Key}
			rate  1r/h
			burst 5
		}
	}
	respond "ok"
`, strings.Join(addrs, " "), prefix, chaosTimeout)
}

// result is one request of a load.
type result struct {
	at     time.Duration // since the load started
	key    string
	status int // 0: no answer
	took   time.Duration
}

// load sends GET path from workers, each cycling through keys with a short
// pause, for d, and returns every request's result. during runs meanwhile,
// with the load's start time.
func load(t *testing.T, base, path string, keys []string, d time.Duration, during func(start time.Time)) []result {
	t.Helper()
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Since(start) < d; i += 8 {
				key := keys[i%len(keys)]
				t0 := time.Now()
				s := statusOf(base, path, key)
				mu.Lock()
				results = append(results, result{at: t0.Sub(start), key: key, status: s, took: time.Since(t0)})
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	if during != nil {
		during(start)
	}
	wg.Wait()
	return results
}

// statusOf is status without failing the test: 0 when there is no answer.
func statusOf(base, path, key string) int {
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// exactly checks that a fresh key on /exact gets exactly 5 requests, then
// 429.
func exactly(t *testing.T, when, base, key string) {
	t.Helper()
	for i := range 7 {
		want := 200
		if i >= 5 {
			want = 429
		}
		if s := statusOf(base, "/exact", key); s != want {
			t.Fatalf("%s: key %s request %d on /exact: status %d; want %d", when, key, i, s, want)
		}
	}
}

// tally counts results by status.
func tally(results []result) map[int]int {
	n := map[int]int{}
	for _, r := range results {
		n[r.status]++
	}
	return n
}

// redisKey is the Redis key of an API key's bucket in zone.
func redisKey(prefix, apiKey, zone string) string {
	return redisstore.RedisKey(prefix, zone, bucket.KeyHash(apiKey))
}

// keysByMaster sorts n API keys by the master that holds their bucket.
func keysByMaster(t *testing.T, c *redis.ClusterClient, prefix string, n int) map[string][]string {
	t.Helper()
	byMaster := map[string][]string{}
	for i := range n {
		key := fmt.Sprintf("key-%d", i)
		m, err := c.MasterForKey(context.Background(), redisKey(prefix, key, "load"))
		if err != nil {
			t.Fatal(err)
		}
		byMaster[m.Options().Addr] = append(byMaster[m.Options().Addr], key)
	}
	return byMaster
}

// failoverDone waits until a master other than dead serves key's slot and
// answers, and returns when.
func failoverDone(t *testing.T, addrs []string, dead, key string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: slices.DeleteFunc(slices.Clone(addrs), func(a string) bool { return a == dead })})
		m, err := c.MasterForKey(context.Background(), key)
		ok := err == nil && m.Options().Addr != dead && m.Ping(context.Background()).Err() == nil
		c.Close()
		if ok {
			return time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no failover of %s within %s", dead, timeout)
	return time.Time{}
}

// splitByKeys splits results into those of keys and the others.
func splitByKeys(results []result, keys []string) (in, out []result) {
	for _, r := range results {
		if slices.Contains(keys, r.key) {
			in = append(in, r)
		} else {
			out = append(out, r)
		}
	}
	return in, out
}

// chaosCluster starts a cluster of its own (3 masters with replicas each,
// serving its slots while a master is down), a Caddy on it, and sorts 200
// API keys by the master holding their buckets.
func chaosCluster(t *testing.T, replicas int) (*redistest.Cluster, *testcaddy.Caddy, string, map[string][]string) {
	t.Helper()
	cl := redistest.NewClusterOf(t, 3, replicas, "--cluster-require-full-coverage", "no")
	prefix := fmt.Sprintf("chaos%d:", time.Now().UnixNano())
	c := testcaddy.Start(t, chaosSite(prefix, cl.Addrs()...))
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer rc.Close()
	return cl, c, prefix, keysByMaster(t, rc, prefix, 200)
}

// TestChaosMasterKilled: a master SIGKILLed under load. Only its keys go
// to the failure mode, until its replica takes over; the other masters'
// keys keep exact Redis decisions.
func TestChaosMasterKilled(t *testing.T) {
	cl, c, prefix, byMaster := chaosCluster(t, 1)
	var dead string
	for m := range byMaster {
		dead = m
		break
	}
	for m := range byMaster {
		exactly(t, "before", c.URL, "exact-before-"+byMaster[m][0])
	}
	var keys []string
	for _, ks := range byMaster {
		keys = append(keys, ks...)
	}
	var killedAt, failedOver time.Duration
	results := load(t, c.URL, "/load", keys, 8*time.Second, func(start time.Time) {
		time.Sleep(time.Second)
		killedAt = time.Since(start)
		cl.Server(dead).Kill()
		failedOver = failoverDone(t, cl.Addrs(), dead, redisKey(prefix, byMaster[dead][0], "load"), 20*time.Second).Sub(start)
	})
	deadKeys, healthy := splitByKeys(results, byMaster[dead])
	assertHealthy(t, healthy, killedAt)
	var last time.Duration
	for _, r := range deadKeys {
		if r.status != 200 && r.at > last {
			last = r.at
		}
	}
	t.Logf("master killed: healthy keys %v; dead master's keys %v; failover took %s, its keys recovered %s after the kill (%s after the failover)",
		tally(healthy), tally(deadKeys), failedOver-killedAt, last-killedAt, last-failedOver)
	if last > failedOver+2*time.Second {
		t.Errorf("the dead master's keys recovered %s after the failover; want at most 2s", last-failedOver)
	}
	for _, m := range byMaster {
		exactly(t, "after", c.URL, "exact-after-"+m[0])
	}
}

// assertHealthy checks that at least 95% of the healthy keys' decisions
// after since came from Redis (200: /load never refuses).
func assertHealthy(t *testing.T, healthy []result, since time.Duration) {
	t.Helper()
	total, ok := 0, 0
	for _, r := range healthy {
		if r.at >= since {
			total++
			if r.status == 200 {
				ok++
			}
		}
	}
	if total == 0 || float64(ok) < 0.95*float64(total) {
		t.Errorf("healthy masters' keys: %d of %d decided by Redis during the fault; want at least 95%%", ok, total)
	}
}

// TestChaosMasterHung: a master SIGSTOPped (hung, not dead) under load.
// Its keys wait no longer than the timeout (then the breaker skips the
// node), the breaker opens for that node only, and the others' keys are
// decided by Redis.
func TestChaosMasterHung(t *testing.T) {
	cl, c, _, byMaster := chaosCluster(t, 0)
	var hung string
	var keys []string
	for m, ks := range byMaster {
		hung = m
		keys = append(keys, ks...)
	}
	var pausedAt time.Duration
	breakers := map[string]float64{}
	results := load(t, c.URL, "/load", keys, 5*time.Second, func(start time.Time) {
		time.Sleep(time.Second)
		pausedAt = time.Since(start)
		cl.Server(hung).Pause()
		time.Sleep(2 * time.Second)
		for m := range byMaster {
			breakers[m] = scrape(t, c, fmt.Sprintf(`caddy_rate_limit_circuit_breaker_open{node=%q}`, m))
		}
		cl.Server(hung).Resume()
	})
	hungKeys, healthy := splitByKeys(results, byMaster[hung])
	assertHealthy(t, healthy, pausedAt)
	var slowest time.Duration
	for _, r := range hungKeys {
		slowest = max(slowest, r.took)
	}
	t.Logf("master hung for 2s: healthy keys %v; hung master's keys %v, slowest %s; breakers %v",
		tally(healthy), tally(hungKeys), slowest, breakers)
	if slowest > time.Second { // the timeout is 100ms; the rest is a loaded, race-enabled machine
		t.Errorf("a request on the hung master took %s; want it bounded by the 100ms timeout", slowest)
	}
	for m, open := range breakers {
		if want := map[bool]float64{true: 1, false: 0}[m == hung]; open != want && !(want == 0 && open == -1) {
			t.Errorf("breaker of %s: %v; want %v", m, open, want)
		}
	}
	for _, m := range byMaster {
		exactly(t, "after", c.URL, "exact-after-"+m[0])
	}
}

// recoveredAfter is the time of the last non-200 result at or after since,
// minus since: how long the fault cost (0 when none).
func recoveredAfter(results []result, since time.Duration) time.Duration {
	var last time.Duration
	for _, r := range results {
		if r.status != 200 && r.at >= since && r.at-since > last {
			last = r.at - since
		}
	}
	return last
}

// TestChaosRestartDataLost: Redis killed and started again empty under
// load. Limits start afresh, and decisions come back with the breaker's
// first probe once Redis answers: at most its cool-down and a probe (the
// timeout) after Redis answered a PING. Then nothing fails, but decisions
// that wait out the timeout (stalls of a loaded machine, which the breaker
// takes for a hung Redis, as it must) and, for a cool-down and a probe
// after them, those the breaker refuses.
func TestChaosRestartDataLost(t *testing.T) {
	srv := redistest.NewServer(t)
	prefix := fmt.Sprintf("restart%d:", time.Now().UnixNano())
	c := testcaddy.Start(t, chaosSite(prefix, srv.Addr))
	exactly(t, "before", c.URL, "spent")
	keys := []string{"a", "b", "c", "d"}
	var began time.Time
	var upAt time.Duration
	results := load(t, c.URL, "/load", keys, 6*time.Second, func(start time.Time) {
		began = start
		time.Sleep(time.Second)
		srv.Kill()
		time.Sleep(time.Second)
		if err := srv.Start(); err != nil {
			t.Error(err)
		}
		upAt = srv.Up().Sub(start) // not when Start returned
	})
	bound := redisstore.BreakerCooldown + chaosTimeout // at worst the breaker opened as Redis came back
	back, slow, unexplained, quiet := afterRestart(results, upAt, bound)
	t.Logf("restarted empty: %v; decisions came back %s after Redis answered a PING; %d later decisions waited out the %s timeout",
		tally(results), back, slow, chaosTimeout)
	for _, r := range unexplained[:min(len(unexplained), 5)] {
		t.Errorf("Redis back: status %d %s after it answered (in %s), past its breaker's cool-down and a probe (%s), after no timeout",
			r.status, r.at-upAt, r.took, bound)
	}
	// Until a breaker that timeouts opened again may probe:
	time.Sleep(time.Until(began.Add(quiet)))
	exactly(t, "after, afresh", c.URL, "spent") // the data is gone: the spent key starts again
	exactly(t, "after", c.URL, "fresh")
}

// afterRestart sorts the results of a load during which Redis came back
// at up: back is how long after up the first decision by Redis came (-1:
// none); slow counts the failures since up that waited out the timeout;
// unexplained are the others from up+bound on that came later than bound
// after every slow one. quiet is when the last such bound ends.
func afterRestart(results []result, up, bound time.Duration) (back time.Duration, slow int, unexplained []result, quiet time.Duration) {
	slices.SortFunc(results, func(a, b result) int { return cmp.Compare(a.at, b.at) })
	back, quiet = -1, up+bound
	for _, r := range results {
		switch {
		case r.at < up:
		case r.status == 200:
			if back < 0 {
				back = r.at - up
			}
		case r.took >= chaosTimeout:
			slow++
			quiet = max(quiet, r.at+r.took+bound)
		case r.at >= quiet:
			unexplained = append(unexplained, r)
		}
	}
	return back, slow, unexplained, quiet
}

// TestChaosClientPause: CLIENT PAUSE under load holds every command for a
// while: decisions wait at most the timeout, then fail over to
// on_store_error, and Redis decides again right after the pause.
func TestChaosClientPause(t *testing.T) {
	srv := redistest.NewServer(t)
	prefix := fmt.Sprintf("pause%d:", time.Now().UnixNano())
	c := testcaddy.Start(t, chaosSite(prefix, srv.Addr))
	exactly(t, "before", c.URL, "before")
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	var endAt time.Duration
	results := load(t, c.URL, "/load", []string{"a", "b", "c"}, 5*time.Second, func(start time.Time) {
		time.Sleep(time.Second)
		if err := rc.Do(context.Background(), "CLIENT", "PAUSE", 1500, "ALL").Err(); err != nil {
			t.Error(err)
		}
		endAt = time.Since(start) + 1500*time.Millisecond
	})
	var slowest time.Duration
	for _, r := range results {
		slowest = max(slowest, r.took)
	}
	recovered := recoveredAfter(results, endAt)
	t.Logf("CLIENT PAUSE 1.5s: %v; slowest %s; decisions came back %s after the pause", tally(results), slowest, recovered)
	if slowest > time.Second {
		t.Errorf("a request took %s during the pause; want it bounded by the 100ms timeout", slowest)
	}
	if recovered > 2500*time.Millisecond {
		t.Errorf("after the pause: failures went on for %s", recovered)
	}
	exactly(t, "after", c.URL, "after")
}

// TestChaosScriptFlushUnderLoad: SCRIPT FLUSH on every master while
// requests run: each script is sent again, and every key still gets
// exactly its limit.
func TestChaosScriptFlushUnderLoad(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	prefix := fmt.Sprintf("flushload%d:", time.Now().UnixNano())
	c := testcaddy.Start(t, chaosSite(prefix, addrs...))
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rc.Close()
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("flush-%d", i))
	}
	flushes := 0
	results := load(t, c.URL, "/exact", keys, 3*time.Second, func(time.Time) {
		for range 10 {
			time.Sleep(250 * time.Millisecond)
			err := rc.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error {
				return n.ScriptFlush(ctx).Err()
			})
			if err != nil {
				t.Error(err)
			}
			flushes++
		}
	})
	allowed := map[string]int{}
	for _, r := range results {
		switch r.status {
		case 200:
			allowed[r.key]++
		case 429:
		default:
			t.Fatalf("status %d during SCRIPT FLUSH", r.status)
		}
	}
	for _, k := range keys {
		if allowed[k] != 5 {
			t.Fatalf("key %s: %d allowed across %d SCRIPT FLUSHes; want exactly 5", k, allowed[k], flushes)
		}
	}
	t.Logf("SCRIPT FLUSH x%d under load: %v, every key exactly 5 allowed", flushes, tally(results))
}

// TestChaosReloadsUnderLoad: 20 config reloads while requests run. No
// request fails (Go's client retries an idle connection that Caddy closed
// on reload), counters go on, and Redis sees no more connections after.
func TestChaosReloadsUnderLoad(t *testing.T) {
	srv := redistest.NewServer(t)
	prefix := fmt.Sprintf("reloads%d:", time.Now().UnixNano())
	site := func(i int) string { return chaosSite(prefix, srv.Addr) + fmt.Sprintf("\t# reload %d\n", i) }
	c := testcaddy.Start(t, site(0))
	exactly(t, "before", c.URL, "before")
	load(t, c.URL, "/load", []string{"a", "b", "c"}, time.Second, nil) // the pool grows to the load
	before := connectedClients(t, srv.Addr)
	results := load(t, c.URL, "/load", []string{"a", "b", "c"}, 4*time.Second, func(time.Time) {
		for i := range 20 {
			if err := c.Reload(site(i + 1)); err != nil {
				t.Error(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	counts := tally(results)
	t.Logf("20 reloads under load: %v; connected_clients %s before, %s after", counts, before, connectedClients(t, srv.Addr))
	if len(counts) != 1 || counts[200] == 0 {
		t.Errorf("statuses during reloads: %v; want only 200", counts)
	}
	if after := connectedClients(t, srv.Addr); atoi(after) > atoi(before)+1 { // +1: the pool follows the load
		t.Errorf("connected_clients %s before 20 reloads, %s after", before, after)
	}
	exactly(t, "after", c.URL, "after")
	if s := statusOf(c.URL, "/exact", "before"); s != 429 { // the counter went on across the reloads
		t.Errorf("a key spent before the reloads: status %d; want 429", s)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
