package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// The fleet scenario, shared by the end-to-end tests of the fleet's
// features: three Caddy instances on a Redis Cluster, traffic of many
// client keys at a paced rate (pace) or as fast as it goes (flood), and
// what to read of it: the sync rounds by result (syncs), the errors each
// Redis node counted (errorStats), the bound each instance states for a
// zone that syncs (statedBound). Faults on a cluster the test owns are in
// fleetfaults_test.go.

// fleetScenario is three Caddy instances sharing the Redis at addrs,
// under a key prefix of their own.
type fleetScenario struct {
	t      *testing.T
	addrs  []string
	prefix string
	caddys []*testcaddy.Caddy
}

// startFleet starts three Caddy instances, one after the other, on the
// site that site makes of a fresh key prefix and addrs.
func startFleet(t *testing.T, addrs []string, site func(prefix string, addrs []string) string) *fleetScenario {
	t.Helper()
	f := &fleetScenario{t: t, addrs: addrs, prefix: fmt.Sprintf("fleet%d:", time.Now().UnixNano())}
	body := site(f.prefix, addrs)
	for range 3 {
		f.caddys = append(f.caddys, testcaddy.Start(t, body))
	}
	return f
}

// syncSite is a site whose rate_limit uses the Redis at addrs (a call
// waits at most 1s; a request Redis cannot decide is refused) with zones,
// and answers "ok".
func syncSite(prefix string, addrs []string, zones ...string) string {
	return fmt.Sprintf("\trate_limit {\n\t\tredis {\n\t\t\taddresses %s\n\t\t\tkey_prefix %s\n\t\t\ttimeout 1s\n\t\t}\n\t\ton_store_error deny\n%s\t}\n\trespond \"ok\"\n",
		strings.Join(addrs, " "), prefix, strings.Join(zones, ""))
}

// syncZone is a zone keyed by the X-API-Key header, of paths, counting
// with algorithm ("" for the token bucket) at rate, that syncs every
// interval.
func syncZone(name, paths, algorithm, rate, interval string) string {
	alg := ""
	if algorithm != "" {
		alg = "\t\t\talgorithm " + algorithm + "\n"
	}
	return fmt.Sprintf("\t\tzone %s {\n\t\t\tmatch {\n\t\t\t\tpath %s\n\t\t\t}\n\t\t\tkey {http.request.header.X-API-Key}\n%s\t\t\trate %s\n\t\t\tsync %s\n\t\t}\n",
		name, paths, alg, rate, interval)
}

// shot is one request of a traffic.
type shot struct {
	sent, done time.Time
	via        int // the instance it went through
	path, key  string
	status     int // 0: no answer
}

// pacer sends a traffic from a pool of workers until it is stopped.
type pacer struct {
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	mu    sync.Mutex
	shots []shot
	next  atomic.Int64
	done  atomic.Int64
}

// paceWorkers is how many requests a traffic has in flight at most.
const paceWorkers = 16

// pace starts a traffic through the fleet: request i of at most n is sent
// at start + i/rate (later when the workers are busy), through the
// instance, on the path and with the key that next(i) gives; none after
// limit. A rate of 0 sends as fast as the workers go. Stop ends it (the
// test's cleanup does too).
func (f *fleetScenario) pace(rate float64, n int, limit time.Duration, next func(i int) (via int, path, key string)) *pacer {
	p := &pacer{stop: make(chan struct{})}
	start := time.Now()
	for range paceWorkers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for {
				i := int(p.next.Add(1) - 1)
				var at time.Duration
				if rate > 0 {
					at = time.Duration(float64(i) / rate * float64(time.Second))
				}
				if i >= n || at > limit || time.Since(start) > limit {
					return
				}
				select {
				case <-p.stop:
					return
				case <-time.After(time.Until(start.Add(at))):
				}
				p.add(f.send(next(i)))
			}
		}()
	}
	f.t.Cleanup(func() { p.Stop() })
	return p
}

// send sends one request of a traffic.
func (f *fleetScenario) send(via int, path, key string) shot {
	s := shot{sent: time.Now(), via: via, path: path, key: key}
	s.status = statusOf(f.caddys[via].URL, path, key)
	s.done = time.Now()
	return s
}

func (p *pacer) add(s shot) {
	p.mu.Lock()
	p.shots = append(p.shots, s)
	p.mu.Unlock()
	p.done.Add(1)
}

// Stop ends the traffic, waits for the requests in flight, and returns
// every request's shot.
func (p *pacer) Stop() []shot {
	p.once.Do(func() { close(p.stop) })
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.shots
}

// Wait waits until the traffic has sent n requests, or within, and
// reports whether it did.
func (p *pacer) Wait(n int, within time.Duration) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if p.done.Load() >= int64(n) {
			return true
		}
	}
	return false
}

// flood sends key through the fleet as fast as the workers go, for d:
// request i on paths[i%len(paths)], through each instance in turn for
// each path. It returns the shots.
func (f *fleetScenario) flood(d time.Duration, key string, paths ...string) []shot {
	p := f.pace(0, math.MaxInt, d, func(i int) (int, string, string) {
		return i / len(paths) % len(f.caddys), paths[i%len(paths)], key
	})
	time.Sleep(d)
	return p.Stop()
}

// admitted counts the shots on path that were admitted (200).
func admitted(shots []shot, path string) (ok, sent int) {
	for _, s := range shots {
		if s.path == path {
			sent++
			if s.status == 200 {
				ok++
			}
		}
	}
	return ok, sent
}

// syncTally is the fleet's sync rounds by result.
type syncTally struct{ ok, err float64 }

// syncs sums caddy_rate_limit_syncs_total by result over the fleet.
func (f *fleetScenario) syncs() syncTally {
	var n syncTally
	for _, c := range f.caddys {
		n.ok += max(scrape(f.t, c, `caddy_rate_limit_syncs_total{result="ok"}`), 0)
		n.err += max(scrape(f.t, c, `caddy_rate_limit_syncs_total{result="error"}`), 0)
	}
	return n
}

// logMarks is where each instance's logs end now.
func (f *fleetScenario) logMarks() []int {
	marks := make([]int, len(f.caddys))
	for i, c := range f.caddys {
		marks[i] = len(c.Logs())
	}
	return marks
}

// stallsOnly accepts failed sync rounds, failed of them since mark, that
// a stall of the machine explains: at most one an instance, each logged as
// one that waited out the timeout (1 s, against a few ms asked of a node
// that answers). A round that failed any other way, or several, fails the
// test.
func (f *fleetScenario) stallsOnly(mark []int, failed float64) {
	f.t.Helper()
	var other []string
	timeouts := 0
	for i, c := range f.caddys {
		for line := range strings.SplitSeq(c.Logs()[mark[i]:], "\n") {
			switch {
			case !strings.Contains(line, "rounds of the zones that sync fail"):
			case strings.Contains(line, "did not answer within the timeout"):
				timeouts++
			default:
				other = append(other, line)
			}
		}
	}
	f.t.Logf("%g sync rounds failed once the faults had ended: %d waited out the timeout (a stalled machine), other failures %q", failed, timeouts, other)
	if len(other) > 0 || failed > float64(len(f.caddys)) || timeouts == 0 {
		f.t.Errorf("%g sync rounds failed once the faults had ended: want none, or one an instance that waited out the timeout", failed)
	}
}

// statedBound is the bound that an instance logged for zone at its start
// with three instances syncing: how far beyond the exact limit the fleet
// may admit over any period (docs/rate_limit.md, sync).
func (f *fleetScenario) statedBound(zone string) float64 {
	f.t.Helper()
	for _, c := range f.caddys {
		for line := range strings.SplitSeq(c.Logs(), "\n") {
			var l struct {
				Msg       string
				Zone      string
				Instances int
				Bound     *float64
			}
			if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Msg, "zone syncs") &&
				l.Zone == zone && l.Instances == 3 && l.Bound != nil {
				return *l.Bound
			}
		}
	}
	f.t.Fatalf("no instance logged the bound of zone %s with 3 instances:\n%s", zone, f.caddys[2].Logs())
	return 0
}

// errorStats reads, by node, the error replies Redis counted by kind
// (INFO errorstats: "CROSSSLOT", "NOSCRIPT"...) and the calls of each
// command it knows that failed or were refused ("calls evalsha"...).
// go-redis names its connections with CLIENT SETINFO, unknown before Redis
// 7.2: an "ERR" of no command, per connection.
func errorStats(t *testing.T, addrs []string) map[string]map[string]int64 {
	t.Helper()
	stats := map[string]map[string]int64{}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
		info, err := c.Info(t.Context(), "errorstats", "commandstats").Result()
		c.Close()
		if err != nil {
			t.Fatalf("INFO of %s: %v", addr, err)
		}
		stats[addr] = map[string]int64{}
		for line := range strings.SplitSeq(info, "\n") {
			var kind string
			var n, failed, rejected int64
			line = strings.TrimSpace(line)
			if _, err := fmt.Sscanf(strings.ReplaceAll(line, ":count=", " "), "errorstat_%s %d", &kind, &n); err == nil {
				stats[addr][kind] = n
			}
			if cmd, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":"); ok && cmd != line {
				_, after, _ := strings.Cut(rest, "rejected_calls=")
				if _, err := fmt.Sscanf(after, "%d,failed_calls=%d", &rejected, &failed); err == nil {
					stats[addr]["calls "+cmd] = rejected + failed
				}
			}
		}
	}
	return stats
}

// newErrors is what after counts beyond before, by node and kind.
func newErrors(before, after map[string]map[string]int64) map[string]map[string]int64 {
	grew := map[string]map[string]int64{}
	for addr, kinds := range after {
		for kind, n := range kinds {
			if d := n - before[addr][kind]; d > 0 {
				if grew[addr] == nil {
					grew[addr] = map[string]int64{}
				}
				grew[addr][kind] = d
			}
		}
	}
	return grew
}

// clientKeys are n client keys (API keys) named after name.
func clientKeys(name string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", name, i)
	}
	return keys
}

// keysPerMaster counts keys by the master holding their buckets in zone
// (every zone of a key shares its hash tag, the key's digest).
func (f *fleetScenario) keysPerMaster(zone string, keys []string) map[string]int {
	f.t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: f.addrs, DisableIdentity: true})
	defer c.Close()
	n := map[string]int{}
	for _, key := range keys {
		m, err := c.MasterForKey(f.t.Context(), redisstore.RedisKey(f.prefix, zone, bucket.KeyHash(key)))
		if err != nil {
			f.t.Fatal(err)
		}
		n[m.Options().Addr]++
	}
	return n
}
