package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// The chaos suite on a Redis Cluster of its own: a master killed, a
// master hung.

// keysByMaster sorts API keys by the master that holds their bucket in
// zone.
func keysByMaster(t *testing.T, c *redis.ClusterClient, prefix, zone string, keys []string) map[string][]string {
	t.Helper()
	byMaster := map[string][]string{}
	for _, key := range keys {
		m, err := c.MasterForKey(context.Background(), redisKey(prefix, key, zone))
		if err != nil {
			t.Fatal(err)
		}
		byMaster[m.Options().Addr] = append(byMaster[m.Options().Addr], key)
	}
	return byMaster
}

// numbered are n API keys named name-0, name-1...
func numbered(name string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", name, i)
	}
	return keys
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
	return cl, c, prefix, keysByMaster(t, rc, prefix, "load", numbered("key", 200))
}

// TestChaosMasterKilled: a master SIGKILLed under load. Only its keys go
// to the failure mode, until its replica takes over (they are back within
// 2s of the failover); the other masters' keys keep exact Redis
// decisions. Failures that stalls explain are excused (see stalls).
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
	var began time.Time
	var killedAt, failedOver time.Duration
	results := load(t, c.URL, "/load", keys, 8*time.Second, func(start time.Time) {
		began = start
		time.Sleep(time.Second)
		killedAt = time.Since(start)
		cl.Server(dead).Kill()
		failedOver = failoverDone(t, cl.Addrs(), dead, redisKey(prefix, byMaster[dead][0], "load"), 20*time.Second).Sub(start)
	})
	deadKeys, healthy := splitByKeys(results, byMaster[dead])
	v := stalls(deadKeys, killedAt, failedOver+2*time.Second)
	others := healthyMasters(t, results, byMaster, dead, killedAt)
	t.Logf("master killed: healthy keys %v; dead master's keys %v; failover took %s, its last failure no stall explains came %s after the kill (%s after the failover); %d decisions waited out the %s timeout",
		tally(healthy), tally(deadKeys), failedOver-killedAt, v.last-killedAt, v.last-failedOver, v.slow+slowOf(others), chaosTimeout)
	v.report(t, "the dead master's keys", fmt.Sprintf("over 2s after the failover (at %s)", failedOver))
	waitQuiet(began, append(others, v)...)
	for _, m := range byMaster {
		exactlyAfter(t, "after", c.URL, "exact-after-"+m[0])
	}
}

// healthyMasters judges the keys of each master but skip: from since on,
// none may fail but for stalls (see stalls).
func healthyMasters(t *testing.T, results []result, byMaster map[string][]string, skip string, since time.Duration) []stallVerdict {
	t.Helper()
	var verdicts []stallVerdict
	for m, ks := range byMaster {
		if m == skip {
			continue
		}
		mine, _ := splitByKeys(results, ks)
		v := stalls(mine, since, since)
		v.report(t, "the keys of the healthy master "+m, "during the fault")
		verdicts = append(verdicts, v)
	}
	return verdicts
}

// slowOf counts the decisions of verdicts that waited out the timeout.
func slowOf(verdicts []stallVerdict) int {
	n := 0
	for _, v := range verdicts {
		n += v.slow
	}
	return n
}

// TestChaosMasterHung: a master SIGSTOPped (hung, not dead) under load.
// Its keys wait no longer than the timeout (then the breaker skips the
// node), the breaker opens for that node only, and the others' keys are
// decided by Redis but for stalls (see stalls).
func TestChaosMasterHung(t *testing.T) {
	cl, c, _, byMaster := chaosCluster(t, 0)
	var hung string
	var keys []string
	for m, ks := range byMaster {
		hung = m
		keys = append(keys, ks...)
	}
	var began time.Time
	var pausedAt time.Duration
	breakers := map[string]float64{}
	results := load(t, c.URL, "/load", keys, 5*time.Second, func(start time.Time) {
		began = start
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
	others := healthyMasters(t, results, byMaster, hung, pausedAt)
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
	waitQuiet(began, others...)
	for _, m := range byMaster {
		exactlyAfter(t, "after", c.URL, "exact-after-"+m[0])
	}
}
