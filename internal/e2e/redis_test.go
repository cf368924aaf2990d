package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}

// status sends GET path with an API key and returns the status code.
func status(t *testing.T, base, path, key string) int {
	t.Helper()
	s, err := tryStatus(base, path, key)
	if err != nil {
		t.Errorf("GET %s: %v", path, err)
	}
	return s
}

// tryStatus is status's request: the status, or 0 and the error.
func tryStatus(base, path, key string) (int, error) {
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// redisBlock configures Redis for tests that count exactly: a timeout long
// enough for a loaded test machine, and deny on errors (503), so that no
// request is decided by the local fallback.
func redisBlock(prefix string, addrs ...string) string {
	return fmt.Sprintf("\t\tredis {\n\t\t\taddresses %s\n\t\t\tkey_prefix %s\n\t\t\ttimeout 10s\n\t\t}\n\t\ton_store_error deny\n",
		strings.Join(addrs, " "), prefix)
}

// TestFleetSharesOneExactLimit: three Caddy instances share the cluster;
// 1,000 concurrent requests on one key pass exactly the burst.
func TestFleetSharesOneExactLimit(t *testing.T) {
	prefix := fmt.Sprintf("fleet%d:", time.Now().UnixNano())
	site := "\trate_limit {\n" + redisBlock(prefix, redistest.ClusterAddrs(t)...) + `
		zone slow {
			match {
				path /slow
			}
			key   {http.request.header.X-API-Key}
			rate  1r/h
			burst 50
		}
		zone many {
			match {
				path /many
			}
			key   {http.request.header.X-API-Key}
			rate  1r/h
			burst 10
		}
		zone refill {
			match {
				path /refill
			}
			key   {http.request.header.X-API-Key}
			rate  20r/s
			burst 20
		}
	}
	respond "ok"
`
	var fleet []*testcaddy.Caddy
	for range 3 {
		fleet = append(fleet, testcaddy.Start(t, site))
	}
	// count sends keys*perKey requests from 50 workers, each waiting pace
	// between its requests, and counts what passed per key.
	count := func(path string, keys, perKey int, pace time.Duration) ([]int64, time.Duration) {
		allowed := make([]int64, keys)
		var wg sync.WaitGroup
		var mu sync.Mutex
		start := time.Now()
		for w := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < keys*perKey; i += 50 {
					if i != w {
						time.Sleep(pace)
					}
					k := i % keys
					switch s := status(t, fleet[i%3].URL, path, fmt.Sprint("key-", k)); s {
					case 200:
						mu.Lock()
						allowed[k]++
						mu.Unlock()
					case 429:
					default:
						t.Errorf("%s: status %d", path, s)
					}
				}
			}()
		}
		wg.Wait()
		return allowed, time.Since(start)
	}
	if got := first(count("/slow", 1, 1000, 0)); got[0] != 50 {
		t.Fatalf("one key, 1,000 requests over 3 instances: %d allowed; want exactly the burst, 50", got[0])
	}
	for k, n := range first(count("/many", 20, 30, 0)) {
		if n != 10 {
			t.Fatalf("20 keys at once: key-%d: %d of 30 allowed; want exactly the burst, 10", k, n)
		}
	}
	// At 20r/s, what passes is the burst plus what refilled meanwhile.
	// Requests come steadily for about 1.4s (50 workers, one request each
	// 125ms), several per refilled token, so every token refilled before
	// the last round of requests is taken.
	got, took := count("/refill", 1, 600, 125*time.Millisecond)
	refilled := took.Seconds() * 20
	lo, hi := 20+int64(refilled-2*0.125*20)-1, 20+int64(refilled)+1
	t.Logf("20r/s burst 20: %d of 600 allowed in %s (%.1f tokens refilled)", got[0], took, refilled)
	if got[0] < lo || got[0] > hi {
		t.Fatalf("20r/s burst 20 over %s: %d allowed; want the burst plus what refilled: %d to %d", took, got[0], lo, hi)
	}
}

// statusOrNone is status, 0 when no response came (a transport error).
func statusOrNone(base, path, key string) int {
	s, _ := tryStatus(base, path, key)
	return s
}

// connectedClients is the number of clients connected to a Redis server.
func connectedClients(t *testing.T, addr string) string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "clients").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			return v
		}
	}
	t.Fatalf("no connected_clients in %q", info)
	return ""
}

func TestReloadsReuseRedisConnections(t *testing.T) {
	srv := redistest.NewServer(t)
	site := func(rate int) string {
		return "\trate_limit {\n" + redisBlock("reload:", srv.Addr) + fmt.Sprintf(`
		zone api {
			key   {http.request.header.X-API-Key}
			rate  %dr/d
			burst 100
		}
	}
	respond "ok %d"
`, rate, rate)
	}
	c := testcaddy.Start(t, site(100))
	for range 3 {
		status(t, c.URL, "/", "a")
	}
	before := connectedClients(t, srv.Addr)
	for i := range 50 {
		if err := c.Reload(site(100 + i%2)); err != nil {
			t.Fatal(err)
		}
		// A reload shuts the old server down: a kept-alive connection, or
		// one it accepted as it stopped, may break under the next request
		// before any handler sees it (Caddy's, not the limiter's; what is
		// measured here is Redis's connections). Such a request, with no
		// response at all, is sent again once on a new connection.
		client.CloseIdleConnections()
		s := statusOrNone(c.URL, "/", "a")
		if s == 0 {
			client.CloseIdleConnections()
			s = status(t, c.URL, "/", "a")
		}
		if s != 200 {
			t.Fatalf("reload %d: status %d", i, s)
		}
	}
	if after := connectedClients(t, srv.Addr); after != before {
		t.Fatalf("connected_clients %s before 50 reloads, %s after", before, after)
	}
	// The counter went on across the reloads: 3 + 50 of 100 used.
	resp, _ := get(t, c, "/", "X-API-Key", "a")
	expect(t, resp, 200, "46")
}

func TestScriptFlushMidRun(t *testing.T) {
	srv := redistest.NewServer(t)
	c := testcaddy.Start(t, "\trate_limit {\n"+redisBlock("flush:", srv.Addr)+`
		zone api {
			key   {http.request.header.X-API-Key}
			rate  1r/h
			burst 30
		}
	}
	respond "ok"
`)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	allowed := 0
	for i := range 40 {
		if i%5 == 0 {
			if err := rc.ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		switch s := status(t, c.URL, "/", "k"); s {
		case 200:
			allowed++
		case 429:
		default:
			t.Fatalf("request %d after SCRIPT FLUSH: status %d", i, s)
		}
	}
	if allowed != 30 {
		t.Fatalf("%d allowed; want 30", allowed)
	}
}

// TestRedisDown stops Redis under three handlers, one per failure mode,
// then brings it back.
func TestRedisDown(t *testing.T) {
	srv := redistest.NewServer(t)
	zone := func(name, mode string) string {
		return fmt.Sprintf(`
	route /%[1]s {
		rate_limit {
			redis {
				addresses %[3]s
				timeout   100ms
			}
			on_store_error %[2]s
			zone %[1]s {
				key   {http.request.header.X-API-Key}
				rate  1r/h
				burst 3
			}
		}
		respond "ok"
	}`, name, mode, srv.Addr)
	}
	c := testcaddy.Start(t, zone("allow", "allow")+zone("deny", "deny 429")+zone("local", "local"))
	check := func(when, path, key string, want ...int) {
		t.Helper()
		for i, w := range want {
			start := time.Now()
			resp, _, err := c.Get(path, "X-API-Key", key)
			if err != nil {
				t.Fatalf("%s %s: %v", when, path, err)
			}
			// Bounded by the timeout (100ms), with room for a slow machine.
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("%s %s request %d took %s", when, path, i, took)
			}
			if resp.StatusCode != w {
				t.Fatalf("%s %s request %d: status %d; want %d", when, path, i, resp.StatusCode, w)
			}
		}
	}
	check("up", "/allow", "warm", 200, 200, 200, 429)
	check("up", "/local", "warm", 200, 200, 200, 429)

	// A Redis that accepts connections but never answers: SIGSTOP.
	srv.Pause()
	check("paused", "/allow", "k", 200, 200, 200, 200, 200)
	check("paused", "/deny", "k", 429, 429)
	check("paused", "/local", "k", 200, 200, 200, 429) // the local bucket is its own
	// A client Redis refused just before stays refused, from the local cache.
	check("paused", "/allow", "warm", 429)
	srv.Resume()

	srv.Kill()
	check("killed", "/allow", "k", 200, 200, 200, 200, 200)
	check("killed", "/deny", "k", 429, 429)
	check("killed", "/local", "k", 429)
	resp, _, _ := c.Get("/deny", "X-API-Key", "k")
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("deny mode: no Retry-After")
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// Redis restarted empty: after the breaker's cool-down, buckets are
	// Redis's again, fresh.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, _, err := c.Get("/allow", "X-API-Key", "k")
		if err == nil && resp.Header.Get("X-RateLimit-Remaining") == "2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Redis decision 10s after Redis came back")
		}
		time.Sleep(200 * time.Millisecond)
	}
	check("back", "/allow", "k", 200, 200, 429)
	logs := c.WaitLogs("redis store available again")
	if n := strings.Count(logs, "redis store failing"); n != 1 {
		t.Errorf("entering the failure mode logged %d times; want once", n)
	}
	if n := strings.Count(logs, "redis store available again"); n != 1 {
		t.Errorf("leaving the failure mode logged %d times; want once", n)
	}
}

func TestRedisUnreachableAtStart(t *testing.T) {
	srv := redistest.NewServer(t)
	srv.Stop()
	c := testcaddy.Start(t, fmt.Sprintf(`
	rate_limit {
		redis {
			addresses %s
		}
		on_store_error deny
		zone api {
			key   {http.request.header.X-API-Key}
			rate  10r/m
		}
	}
	respond "ok"
`, srv.Addr))
	if !strings.Contains(c.WaitLogs("redis not reachable at start"), "redis not reachable at start") {
		t.Fatalf("no warning about the unreachable Redis:\n%s", c.Logs())
	}
	if s := status(t, c.URL, "/", "k"); s != http.StatusServiceUnavailable {
		t.Fatalf("Redis down, on_store_error deny: status %d; want 503", s)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for status(t, c.URL, "/", "k") != 200 {
		if time.Now().After(deadline) {
			t.Fatal("Redis up: still refused after 10s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
