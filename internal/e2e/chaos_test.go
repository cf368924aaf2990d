package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
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
// measured.

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
	status int   // 0: no answer
	err    error // why no answer
	fresh  bool  // sent on a new connection (not one kept alive)
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
				s, fresh, err := answer(base, path, key)
				mu.Lock()
				results = append(results, result{at: t0.Sub(start), key: key, status: s, err: err, fresh: fresh, took: time.Since(t0)})
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
	s, _, _ := answer(base, path, key)
	return s
}

// answer is the status of GET path with key, or 0 and the error when
// there is no answer, and whether it was sent on a new connection.
func answer(base, path, key string) (status int, fresh bool, err error) {
	fresh = true // until a kept-alive connection is got
	trace := &httptrace.ClientTrace{GotConn: func(c httptrace.GotConnInfo) { fresh = !c.Reused }}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, base+path, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, fresh, err
	}
	resp.Body.Close()
	return resp.StatusCode, fresh, nil
}

// exactly checks that a fresh key on /exact gets exactly 5 requests, then
// 429.
func exactly(t *testing.T, when, base, key string) {
	t.Helper()
	if i, r, want := exactRun(base, key); r.status != want {
		t.Fatalf("%s: key %s request %d on /exact: status %d; want %d", when, key, i, r.status, want)
	}
}

// exactRun sends the 7 requests of exactly with key, up to the first
// whose status is not the one wanted: its number, its result and the
// status wanted; the last when all are as wanted.
func exactRun(base, key string) (i int, r result, want int) {
	for i = range 7 {
		want = 200
		if i >= 5 {
			want = 429
		}
		t0 := time.Now()
		s, _, err := answer(base, "/exact", key)
		r = result{key: key, status: s, err: err, took: time.Since(t0)}
		if s != want {
			break
		}
	}
	return i, r, want
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
	back, v := afterRestart(results, upAt, bound)
	t.Logf("restarted empty: %v; decisions came back %s after Redis answered a PING; %d later decisions waited out the %s timeout",
		tally(results), back, v.slow, chaosTimeout)
	for _, r := range v.unexplained[:min(len(v.unexplained), 5)] {
		t.Errorf("Redis back: status %d %s after it answered (in %s), past its breaker's cool-down and a probe (%s), after no timeout",
			r.status, r.at-upAt, r.took, bound)
	}
	if back < 0 {
		t.Errorf("Redis back: no decision by Redis after it answered")
	}
	waitQuiet(began, v)                         // until a breaker that timeouts opened again may probe
	exactly(t, "after, afresh", c.URL, "spent") // the data is gone: the spent key starts again
	exactlyAfter(t, "after", c.URL, "fresh")
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
// requests run: each script is sent again, nothing fails but for stalls
// (see stalls), and every key still gets exactly its limit: 5 allowed,
// or fewer by as many decisions that waited out the timeout (their script
// may have run).
func TestChaosScriptFlushUnderLoad(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	prefix := fmt.Sprintf("flushload%d:", time.Now().UnixNano())
	c := testcaddy.Start(t, chaosSite(prefix, addrs...))
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rc.Close()
	keys := numbered("flush", 40)
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
	slow := 0
	for m, ks := range keysByMaster(t, rc, prefix, "exact", keys) {
		mine, _ := splitByKeys(results, ks)
		v := stalls(mine, 0, 0)
		v.report(t, "the keys on "+m, "during SCRIPT FLUSHes")
		slow += v.slow
	}
	allowed, mayHaveRun := map[string]int{}, map[string]int{}
	for _, r := range results {
		switch {
		case r.status == 200:
			allowed[r.key]++
		case waitedOut(r):
			mayHaveRun[r.key]++
		}
	}
	for _, k := range keys {
		if a := allowed[k]; a > 5 || a+mayHaveRun[k] < 5 {
			t.Errorf("key %s: %d allowed across %d SCRIPT FLUSHes (and %d decisions that waited out the timeout); want 5",
				k, a, flushes, mayHaveRun[k])
		}
	}
	t.Logf("SCRIPT FLUSH x%d under load: %v; slowest %s; %d decisions waited out the %s timeout",
		flushes, tally(results), slowest(results), slow, chaosTimeout)
}

// slowest is the longest a request of results took.
func slowest(results []result) time.Duration {
	var d time.Duration
	for _, r := range results {
		d = max(d, r.took)
	}
	return d
}

// TestChaosReloadsUnderLoad: 20 config reloads while requests run, each
// a new config (Caddy skips one that adapts to the same JSON) on the same
// Redis. No decision fails but for stalls (see stalls), counters go on,
// and Redis sees no more connections after: the handlers share one pool.
// A request on a kept-alive connection that Caddy closed on reload is
// sent again by Go's client; one on a new connection may find no answer
// (reset or EOF), which is Caddy's listener handoff, not a decision: with
// SO_REUSEPORT each config listens on a socket of its own, and closing
// the old one resets the connections still in its queue. Those are
// counted apart.
func TestChaosReloadsUnderLoad(t *testing.T) {
	srv := redistest.NewServer(t)
	prefix := fmt.Sprintf("reloads%d:", time.Now().UnixNano())
	site := func(i int) string { return chaosSite(prefix, srv.Addr) + fmt.Sprintf("\theader X-Reload %d\n", i) }
	c := testcaddy.Start(t, site(0))
	exactly(t, "before", c.URL, "before")
	load(t, c.URL, "/load", []string{"a", "b", "c"}, time.Second, nil) // the pool grows to the load
	before := connectedClients(t, srv.Addr)
	var began time.Time
	results := load(t, c.URL, "/load", []string{"a", "b", "c"}, 4*time.Second, func(start time.Time) {
		began = start
		for i := range 20 {
			if err := c.Reload(site(i + 1)); err != nil {
				t.Error(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	handoff := slices.DeleteFunc(slices.Clone(results), func(r result) bool { return r.status != 0 || !r.fresh })
	v := stalls(slices.DeleteFunc(results, func(r result) bool { return r.status == 0 && r.fresh }), 0, 0)
	t.Logf("20 reloads under load: %v; slowest %s; %d decisions waited out the %s timeout; %d new connections reset by a reload; connected_clients %s before, %s after",
		tally(results), slowest(results), v.slow, chaosTimeout, len(handoff), before, connectedClients(t, srv.Addr))
	v.report(t, "reloads", "during the reloads")
	if resp, _, err := c.Get("/load", "X-API-Key", "a"); err != nil {
		t.Error(err)
	} else if got := resp.Header.Get("X-Reload"); got != "20" {
		t.Errorf("after 20 reloads: X-Reload %q; want the last config's, 20", got)
	}
	if after := connectedClients(t, srv.Addr); atoi(after) > atoi(before)+1 { // +1: the pool follows the load
		t.Errorf("connected_clients %s before 20 reloads, %s after", before, after)
	}
	waitQuiet(began, v)
	exactlyAfter(t, "after", c.URL, "after")
	if s := statusOf(c.URL, "/exact", "before"); s != 429 { // the counter went on across the reloads
		t.Errorf("a key spent before the reloads: status %d; want 429", s)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
