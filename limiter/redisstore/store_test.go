package redisstore

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

func clusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
}

// flushScripts empties the script cache of every master.
func flushScripts(t *testing.T, c *redis.ClusterClient) {
	t.Helper()
	err := c.ForEachShard(context.Background(), func(ctx context.Context, n *redis.Client) error {
		return n.ScriptFlush(ctx).Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRedisScriptFlush(t *testing.T) {
	c := clusterClient(t, redistest.ClusterAddrs(t))
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 100}
	oneSlot := []bucket.Request{{Zone: "a", Key: "k", Policy: p, Cost: 1}, {Zone: "b", Key: "k", Policy: p, Cost: 1}}
	slots := []bucket.Request{{Zone: "a", Key: "x", Policy: p, Cost: 1}, {Zone: "a", Key: "y", Policy: p, Cost: 1}, {Zone: "a", Key: "z", Policy: p, Cost: 1}}
	for i := range 3 {
		for _, reqs := range [][]bucket.Request{oneSlot, slots} {
			d, err := s.Take(t.Context(), reqs)
			if err != nil {
				t.Fatalf("round %d after SCRIPT FLUSH: %v", i, err)
			}
			if want := int64(99 - i); d[0].Remaining != want {
				t.Fatalf("round %d: remaining %d; want %d", i, d[0].Remaining, want)
			}
		}
		flushScripts(t, c)
	}
}

func TestRedisKeysHashed(t *testing.T) {
	c := clusterClient(t, redistest.ClusterAddrs(t))
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Second, Burst: 5}
	odd := []string{"", "{", "}", "{}", "{a}", "{a}b", "x{a}", "héllo, 世界 🚦", strings.Repeat("k", 10<<10), "\x00\xff", "a:b:c"}
	want := len(s.Key("zone", ""))
	slots := map[int64]bool{}
	for _, k := range odd {
		key := s.Key("zone", k)
		if len(key) != want {
			t.Errorf("key of %.20q has length %d; want %d", k, len(key), want)
		}
		if d, err := s.Take(t.Context(), []bucket.Request{{Zone: "zone", Key: k, Policy: p, Cost: 1}}); err != nil || d[0].Remaining != 4 {
			t.Fatalf("key %.20q: %+v, %v", k, d, err)
		}
		slot, err := c.ClusterKeySlot(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
	}
	// "{a}" and "{a}b" would share a slot if the client chose the tag.
	if len(slots) != len(odd) {
		t.Fatalf("%d keys in %d slots; want each in its own", len(odd), len(slots))
	}
	spread := map[int64]bool{}
	for i := range 1000 {
		slot, _ := c.ClusterKeySlot(t.Context(), s.Key("zone", fmt.Sprintf("{same}%d", i))).Result()
		spread[slot] = true
	}
	if len(spread) < 900 {
		t.Fatalf("1000 client keys with one {tag} fell in %d slots; want them spread", len(spread))
	}
}

func TestRedisTTL(t *testing.T) {
	c := clusterClient(t, redistest.ClusterAddrs(t))
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Second, Burst: 10}
	raw := fmt.Sprintf("raw-client-key-%x", rand.Uint64()) // no other test's key holds it
	if _, err := s.Take(t.Context(), []bucket.Request{{Zone: "z", Key: raw, Policy: p, Cost: 3}}); err != nil {
		t.Fatal(err)
	}
	ttl, err := c.PTTL(t.Context(), s.Key("z", raw)).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The bucket is full again, and dropped, 3 s later.
	if ttl < 2500*time.Millisecond || ttl > 3*time.Second {
		t.Fatalf("PTTL %s; want about 3s", ttl)
	}
	// The raw client key is not stored anywhere: no key of any master
	// holds it.
	err = c.ForEachMaster(t.Context(), func(ctx context.Context, m *redis.Client) error {
		if keys, err := m.Keys(ctx, "*"+raw+"*").Result(); err != nil || len(keys) != 0 {
			return fmt.Errorf("raw key stored: %v (%v)", keys, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRedisConcurrentExact: four clients, as four Caddy instances would
// have, share one bucket; exactly the burst passes.
func TestRedisConcurrentExact(t *testing.T) {
	addrs := redistest.ClusterAddrs(t)
	prefix := newRedisStore(t, clusterClient(t, addrs)).prefix
	var stores []*Store
	for range 4 {
		s, _ := New(clusterClient(t, addrs), prefix)
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	hot := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 100}
	each := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 10}
	var hotAllowed atomic.Int64
	var perKey [50]atomic.Int64
	var wg sync.WaitGroup
	for g := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[g%len(stores)]
			for i := range 25 {
				d, err := s.Take(context.Background(), []bucket.Request{{Zone: "hot", Key: "one", Policy: hot, Cost: 1}})
				if err == nil && d[0].Allowed {
					hotAllowed.Add(1)
				}
				k := (g*25 + i) % 50
				d, err = s.Take(context.Background(), []bucket.Request{{Zone: "many", Key: fmt.Sprint(k), Policy: each, Cost: 1}})
				if err == nil && d[0].Allowed {
					perKey[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := hotAllowed.Load(); n != 100 {
		t.Fatalf("hot key: %d of 1000 allowed; want exactly the burst, 100", n)
	}
	for k := range perKey {
		if n := perKey[k].Load(); n != 10 {
			t.Fatalf("key %d: %d of 20 allowed; want exactly 10", k, n)
		}
	}
}

// TestRedisClusterFailover kills the master of a bucket's slot: the store
// rides through the replica's promotion with the same client, and finds
// the script missing from the new master's cache.
func TestRedisClusterFailover(t *testing.T) {
	cl := redistest.NewCluster(t)
	c := clusterClient(t, cl.Addrs())
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 1000}
	req := []bucket.Request{{Zone: "z", Key: "failover", Policy: p, Cost: 1}}
	if _, err := s.Take(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	master, err := c.MasterForKey(t.Context(), s.Key("z", "failover"))
	if err != nil {
		t.Fatal(err)
	}
	addr := master.Options().Addr
	for _, srv := range cl.Servers {
		if srv.Addr == addr {
			srv.Kill()
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		d, err := s.Take(ctx, req)
		cancel()
		if err == nil && d[0].Allowed {
			newMaster, _ := c.MasterForKey(t.Context(), s.Key("z", "failover"))
			if newMaster != nil && newMaster.Options().Addr != addr {
				checkForgotten(t, s, addr, newMaster.Options().Addr)
				return
			}
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	for _, srv := range cl.Servers {
		if srv.Addr != addr {
			n := redis.NewClient(&redis.Options{Addr: srv.Addr})
			nodes, _ := n.ClusterNodes(t.Context()).Result()
			n.Close()
			t.Logf("cluster nodes seen by %s:\n%s", srv.Addr, nodes)
			break
		}
	}
	t.Fatalf("no decision from a promoted replica within 20s: %v", last)
}

// checkForgotten: once two slot maps in a row no longer have dead, the
// store forgets its queue and breaker (and says so), and keeps those of
// alive.
func checkForgotten(t *testing.T, s *Store, dead, alive string) {
	t.Helper()
	var forgotten []string
	s.OnForget(func(node string) { forgotten = append(forgotten, node) })
	has := func(node string) (queue, breaker bool) {
		s.batch.mu.Lock()
		_, queue = s.batch.queues[node]
		s.batch.mu.Unlock()
		s.breakers.mu.Lock()
		_, breaker = s.breakers.byNode[node]
		s.breakers.mu.Unlock()
		return queue, breaker
	}
	if q, b := has(dead); !q || !b {
		t.Fatalf("before: the dead master has a queue %v, a breaker %v; want both", q, b)
	}
	s.forgetGone(t.Context()) // missing once: kept, in case the map was read while another came in
	if q, b := has(dead); !q || !b || len(forgotten) != 0 {
		t.Fatalf("missing from one slot map: queue %v, breaker %v, forgotten %v; want both kept", q, b, forgotten)
	}
	s.forgetGone(t.Context())
	if q, b := has(dead); q || b || !slices.Equal(forgotten, []string{dead}) {
		t.Fatalf("after a failover, the dead master still has a queue %v, a breaker %v; forgotten %v", q, b, forgotten)
	}
	if q, b := has(alive); !q || !b {
		t.Fatalf("the new master lost its queue (%v) or breaker (%v)", !q, !b)
	}
}

// TestRedisRefundKeepsNewerState: a refund undoes its own charge and
// nothing else. Two clients' buckets are charged in separate script runs,
// as on two cluster nodes whose clocks differ by a window; other requests
// then charge the same buckets, in the window after the charge for the
// first, in the same one for the second; then the first charges are
// refunded (as take refunds them when another run refuses the request),
// each at its own reply's time. The other requests' counts must remain.
func TestRedisRefundKeepsNewerState(t *testing.T) {
	windows := []refundClient{{500 * ms, 1500 * ms, 2}, {1500 * ms, 1600 * ms, 2}}
	cases := []struct {
		p       bucket.Policy
		clients []refundClient
	}{
		{bucket.Policy{Algorithm: bucket.FixedWindow, Rate: 5, Period: time.Second, Burst: 5}, windows},
		{bucket.Policy{Algorithm: bucket.SlidingWindowCounter, Rate: 5, Period: time.Second, Burst: 5}, windows},
		// 10 tokens, one back every 100ms; charges of 3 and 2, then 1.
		{bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 10, Period: time.Second, Burst: 10}, []refundClient{{500 * ms, 550 * ms, 7}, {1500 * ms, 1550 * ms, 7}}},
		// One leaves every 100ms, 5 more queue (nodelay).
		{bucket.Policy{Algorithm: bucket.LeakyBucket, Rate: 10, Period: time.Second, Burst: 5, NoDelay: true}, []refundClient{{500 * ms, 550 * ms, 3}, {1500 * ms, 1550 * ms, 3}}},
	}
	stores := map[string]func(t *testing.T) redis.UniversalClient{
		"redis": func(t *testing.T) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
		},
		"cluster": func(t *testing.T) redis.UniversalClient { return clusterClient(t, redistest.ClusterAddrs(t)) },
	}
	for _, c := range cases {
		for name, newClient := range stores {
			t.Run(c.p.Algorithm.String()+"/"+name, func(t *testing.T) {
				testRefundKeepsNewerState(t, newRedisStore(t, newClient(t)), c.p, c.clients)
			})
		}
	}
}

// refundClient is a client of TestRedisRefundKeepsNewerState.
type refundClient struct {
	charge, other time.Duration // since t0: the refunded charge, and the request after it
	want          int64         // remaining for a request of cost 1 at other, after the refund
}

func testRefundKeepsNewerState(t *testing.T, s *Store, p bucket.Policy, clients []refundClient) {
	ctx := t.Context()
	var reqs []bucket.Request
	var runs []scriptRun
	for i, c := range clients {
		r := bucket.Request{Zone: "z", Key: fmt.Sprint("client-", i), Policy: p, Cost: 3}
		reqs = append(reqs, r)
		sr := []scriptRun{{script: scripts[p.Algorithm], idx: []int{i}, keys: []string{s.key(r)}}}
		if err := s.run(ctx, sr, fmt.Sprint(t0.Add(c.charge).UnixMicro()), modeTake, reqs); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, sr[0])
		r.Cost = 2
		if d, err := s.TakeAt(ctx, t0.Add(c.other), []bucket.Request{r}); err != nil || !d[0].Allowed {
			t.Fatalf("client %d: the request after the charge: %+v, %v", i, d, err)
		}
	}
	if err := s.refund(ctx, "", runs, reqs); err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		r := reqs[i]
		r.Cost = 1
		d, err := s.TakeAt(ctx, t0.Add(c.other), []bucket.Request{r})
		if err != nil || !d[0].Allowed || d[0].Remaining != c.want {
			t.Errorf("client %d, after the refund: %+v, %v; want %d remaining", i, d, err, c.want)
		}
	}
}

// TestRedisRefundHugeCost: a refund of a huge cost (which a take would
// refuse, so that no refund follows it) removes the request's own entries
// of a sliding log, no more, and does not loop on it.
func TestRedisRefundHugeCost(t *testing.T) {
	srv := redistest.NewServer(t) // of its own: the old script kept it busy
	s := newRedisStore(t, redis.NewClient(&redis.Options{Addr: srv.Addr}))
	p := bucket.Policy{Algorithm: bucket.SlidingWindowLog, Rate: 5, Period: time.Second, Burst: 5}
	r := bucket.Request{Zone: "z", Key: "k", Policy: p, Cost: 2, ID: "a"}
	if d, err := s.TakeAt(t.Context(), t0, []bucket.Request{r}); err != nil || d[0].Remaining != 3 {
		t.Fatal(d, err)
	}
	r.Cost = math.MaxInt64
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := s.run(ctx, s.scriptRuns([]bucket.Request{r}), fmt.Sprint(t0.UnixMicro()), modeRefund, []bucket.Request{r}); err != nil {
		t.Fatalf("refund of cost %d: %v", r.Cost, err)
	}
	r.Cost, r.ID = 1, "b"
	if d, err := s.TakeAt(t.Context(), t0, []bucket.Request{r}); err != nil || d[0].Remaining != 4 {
		t.Fatalf("after the refund: %+v, %v; want 4 remaining", d, err)
	}
}
