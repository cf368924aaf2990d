package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// overridesSite is a zone of 5 requests an hour per API key, on Redis.
func overridesSite(prefix string, poll string, addrs []string) string {
	return "\trate_limit {\n" + redisBlock(prefix, addrs...) + poll + `
		zone api {
			key   {http.request.header.X-API-Key}
			rate  5r/h
		}
	}
	respond "ok"
`
}

// putOverride changes an override through c's admin API.
func putOverride(t *testing.T, c *testcaddy.Caddy, method, path, body string) {
	t.Helper()
	if status, _, out := adminBody(t, c, method, "/rate_limit/overrides/"+path, body); status != http.StatusOK {
		t.Fatalf("%s %s %s: %d %s", method, path, body, status, out)
	}
}

// overridesVersion is the version of the overrides c has in force.
func overridesVersion(t *testing.T, c *testcaddy.Caddy) int64 {
	t.Helper()
	_, _, body := admin(t, c, http.MethodGet, "/rate_limit/overrides")
	var list []struct {
		Version int64 `json:"version"`
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list) != 1 {
		t.Fatalf("GET /rate_limit/overrides: %s (%v)", body, err)
	}
	return list[0].Version
}

// waitVersion waits until every instance has the overrides of version v
// in force, and says how long that took.
func waitVersion(t *testing.T, fleet []*testcaddy.Caddy, v int64, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for _, c := range fleet {
		for overridesVersion(t, c) < v {
			if time.Since(start) > within {
				t.Fatalf("%s: overrides version %d not in force within %s (has %d)", c.URL, v, within, overridesVersion(t, c))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return time.Since(start)
}

// passedAcross sends n requests of key spread over the fleet, 20 at a
// time, and counts those that passed.
func passedAcross(t *testing.T, fleet []*testcaddy.Caddy, key string, n int) int {
	var passed atomic.Int64
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 20 {
				switch s := status(t, fleet[i%len(fleet)].URL, "/", key); s {
				case 200:
					passed.Add(1)
				case 429:
				default:
					t.Errorf("status %d", s)
				}
			}
		}()
	}
	wg.Wait()
	return int(passed.Load())
}

// limitOf is the X-RateLimit-Limit c shows for key.
func limitOf(t *testing.T, c *testcaddy.Caddy, key string) string {
	t.Helper()
	return limitOn(t, c, "/", key)
}

// limitOn is the X-RateLimit-Limit c shows for key on path.
func limitOn(t *testing.T, c *testcaddy.Caddy, path, key string) string {
	t.Helper()
	resp, _, err := c.Get(path, "X-API-Key", key)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Get("X-Ratelimit-Limit")
}

// TestFleetOverrides: three Caddy instances on one Redis Cluster. An
// override set through one instance's admin API is enforced by the others
// within 2 s (pushed); a key's override gives one API key 100 requests
// where others get 5, on every instance, until it expires; a Caddy started
// afterwards applies the overrides from its first request; with the
// Pub/Sub connections killed, a change still arrives (the poll, or the
// subscription go-redis makes again).
func TestFleetOverrides(t *testing.T) {
	cl := redistest.NewClusterOf(t, 3, 0)
	prefix := fmt.Sprintf("ovr%d:", time.Now().UnixNano())
	site := overridesSite(prefix, "", cl.Addrs())
	var fleet []*testcaddy.Caddy
	for range 3 {
		fleet = append(fleet, testcaddy.Start(t, site))
	}
	if n := passedAcross(t, fleet, "regular", 12); n != 5 {
		t.Fatalf("regular key, no override: %d of 12 passed, want 5", n)
	}

	putOverride(t, fleet[0], "PUT", "api", `{"rate":"2r/h"}`)
	took := waitVersion(t, fleet, overridesVersion(t, fleet[0]), 2*time.Second)
	t.Logf("a zone's override reached every instance in %s (poll 10s: pushed)", took)
	if got := limitOf(t, fleet[2], "fresh"); got != "2" {
		t.Fatalf("the third instance's limit under the zone's override: %q, want 2", got)
	}
	putOverride(t, fleet[0], "DELETE", "api", "")

	putOverride(t, fleet[1], "PUT", "api/key", `{"key":"premium","rate":"100r/h","burst":100,"expires_in":"4s"}`)
	putOverride(t, fleet[1], "PUT", "api/key", `{"key":"gold","rate":"100r/h","burst":100,"expires_in":"4s"}`)
	set := time.Now()
	waitVersion(t, fleet, overridesVersion(t, fleet[1]), 2*time.Second)
	if n := passedAcross(t, fleet, "premium", 120); n != 100 {
		t.Fatalf("premium key, its override: %d of 120 passed, want 100", n)
	}
	if n := passedAcross(t, fleet, "other", 12); n != 5 {
		t.Fatalf("another key meanwhile: %d of 12 passed, want 5", n)
	}
	time.Sleep(time.Until(set.Add(4200 * time.Millisecond)))
	if n := passedAcross(t, fleet, "gold", 12); n != 5 {
		t.Fatalf("gold key once its override expired: %d of 12 passed, want the config's 5", n)
	}
	for _, c := range fleet {
		if got := limitOf(t, c, "premium"); got != "5" {
			t.Fatalf("%s: premium's limit after the expiry: %q, want 5", c.URL, got)
		}
	}

	putOverride(t, fleet[0], "PUT", "api/key", `{"key":"abuser","block":true,"expires_in":"1h"}`)
	late := testcaddy.Start(t, site)
	if resp, _, err := late.Get("/", "X-API-Key", "abuser"); err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a Caddy started after the block, its first request: %v %v; want 429", resp, err)
	}
	fleet = append(fleet, late)

	site = overridesSite(prefix, "\t\toverrides_poll 1s\n", cl.Addrs())
	for _, c := range fleet {
		if err := c.Reload(site); err != nil {
			t.Fatal(err)
		}
	}
	if resp, _, _ := fleet[2].Get("/", "X-API-Key", "abuser"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after a reload, the block: %d, want 429 (a reload keeps the overrides)", resp.StatusCode)
	}
	killPubSub(t, cl)
	putOverride(t, fleet[0], "PUT", "api", `{"rate":"3r/h"}`)
	took = waitVersion(t, fleet, overridesVersion(t, fleet[0]), 3*time.Second)
	t.Logf("with the Pub/Sub connections killed, a change reached every instance in %s", took)
	if got := limitOf(t, fleet[3], "fresh2"); got != "3" {
		t.Fatalf("after the kill, the late instance's limit: %q, want 3", got)
	}
	for _, c := range fleet {
		if logs := c.Logs(); strings.Contains(logs, "abuser") || strings.Contains(logs, "premium") {
			t.Fatalf("%s logged a raw client key", c.URL)
		}
	}
}

// killPubSub kills the Pub/Sub connections of every node of cl.
func killPubSub(t *testing.T, cl *redistest.Cluster) {
	t.Helper()
	killed := int64(0)
	for _, addr := range cl.Addrs() {
		c := redis.NewClient(&redis.Options{Addr: addr})
		n, err := c.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Int64()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		killed += n
	}
	if killed < 4 {
		t.Fatalf("killed %d Pub/Sub connections, want one per instance at least", killed)
	}
}

// TestFleetOverridesSurviveAnEmptyRedis: the Redis that holds the
// overrides, a standalone server or the Cluster master of their slot, is
// killed and restarted empty. Within 5 s (the default overrides_poll of
// 10s: the subscription made again brings the read), the overrides are
// back in Redis, written by one instance, which logs it; every instance,
// and one started just after the restart, enforces them and lists them.
func TestFleetOverridesSurviveAnEmptyRedis(t *testing.T) {
	for _, kind := range []string{"standalone", "cluster master"} {
		t.Run(kind, func(t *testing.T) {
			prefix := fmt.Sprintf("ovrst%d:", time.Now().UnixNano())
			var addrs []string
			var restart func()
			if kind == "standalone" {
				srv := redistest.NewServer(t)
				addrs, restart = []string{srv.Addr}, func() { srv.Kill(); mustStart(t, srv) }
			} else {
				cl := redistest.NewClusterOf(t, 3, 0)
				addrs, restart = cl.Addrs(), func() { restartHolder(t, cl, prefix+"{overrides}") }
			}
			site := overridesSite(prefix, "", addrs)
			fleet := []*testcaddy.Caddy{testcaddy.Start(t, site), testcaddy.Start(t, site)}
			putOverride(t, fleet[0], "PUT", "api", `{"rate":"2r/h"}`)
			putOverride(t, fleet[0], "PUT", "api/key", `{"key":"abuser","block":true}`)
			waitVersion(t, fleet, overridesVersion(t, fleet[0]), 2*time.Second)
			restart()
			restarted := time.Now()
			fleet = append(fleet, testcaddy.Start(t, site))
			for i, c := range fleet {
				for !enforcesOverrides(t, c, i) {
					if time.Since(restarted) > 5*time.Second {
						t.Fatalf("instance %d does not enforce and list the overrides 5s after the restart: %s", i, adminOverrides(t, c))
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			t.Logf("every instance enforces the overrides %s after Redis restarted empty", time.Since(restarted).Round(time.Millisecond))
			restores := 0
			for _, c := range fleet {
				restores += strings.Count(c.Logs(), "rate limit overrides restored")
				if strings.Contains(c.Logs(), "abuser") {
					t.Fatalf("%s logged a raw client key", c.URL)
				}
			}
			if restores != 1 {
				t.Fatalf("%d instances logged a restore, want one", restores)
			}
		})
	}
}

func mustStart(t *testing.T, srv *redistest.Server) {
	t.Helper()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
}

// restartHolder kills the master of cl that holds key, restarts it empty,
// and waits until the cluster is whole again.
func restartHolder(t *testing.T, cl *redistest.Cluster, key string) {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer c.Close()
	master, err := c.MasterForKey(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	srv := cl.Server(master.Options().Addr)
	srv.Kill()
	mustStart(t, srv)
	if err := cl.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// enforcesOverrides reports whether c applies the overrides of
// TestFleetOverridesSurviveAnEmptyRedis (a fresh key's limit is the
// zone's override; the blocked key is refused) and lists them.
func enforcesOverrides(t *testing.T, c *testcaddy.Caddy, i int) bool {
	t.Helper()
	resp, _, err := c.Get("/", "X-API-Key", fmt.Sprintf("fresh%d-%d", i, time.Now().UnixNano()))
	if err != nil || resp.Header.Get("X-Ratelimit-Limit") != "2" {
		return false
	}
	if resp, _, err := c.Get("/", "X-API-Key", "abuser"); err != nil || resp.StatusCode != http.StatusTooManyRequests {
		return false
	}
	list := adminOverrides(t, c)
	return strings.Contains(list, `"rate":"2r/h"`) && strings.Contains(list, `"kind":"block"`) && !strings.Contains(list, `"version":0,`)
}

// adminOverrides is c's listing of the overrides.
func adminOverrides(t *testing.T, c *testcaddy.Caddy) string {
	t.Helper()
	_, _, body := admin(t, c, http.MethodGet, "/rate_limit/overrides")
	return body
}
