package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Batched calls across the slots of a cluster node (see joiner.go): a
// call of several clients' decisions declares no keys.

// loadScripts caches every script on every node of c, replicas too.
func loadScripts(t *testing.T, c *redis.ClusterClient) {
	t.Helper()
	err := c.ForEachShard(t.Context(), func(ctx context.Context, n *redis.Client) error {
		for _, sc := range scripts {
			if err := n.ScriptLoad(ctx, sc.src.(string)).Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// ownCluster starts a cluster of 3 masters of the test's own (its script
// calls and slots are the test's alone), and returns it, a client of it
// and a store on that client.
func ownCluster(t *testing.T) (*redistest.Cluster, *redis.ClusterClient, *Store) {
	t.Helper()
	cl := redistest.NewClusterOf(t, 3, 0)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { c.Close() })
	return cl, c, newRedisStore(t, c)
}

// keysOn returns n client keys (name and a number) whose state lives on
// the master at addr, by c's slot map.
func keysOn(t testing.TB, s *Store, c *redis.ClusterClient, addr, name string, n int) []string {
	t.Helper()
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprint(name, i)
		m, err := c.MasterForKey(t.Context(), s.key(bucket.Request{Zone: "z", Key: k}))
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr == addr {
			keys = append(keys, k)
		}
	}
	return keys
}

// sendBatch sends one take of each of keys (in policy p) as one batch on
// the queue of the node whose client is node, as its flusher does, and
// returns each take's command (its reply or error).
func sendBatch(t testing.TB, s *Store, node *redis.Client, keys []string, p bucket.Policy) []onceCmd {
	t.Helper()
	cmds := make([]onceCmd, len(keys))
	for i, k := range keys {
		r := []bucket.Request{{Zone: "z", Key: k, Policy: p, Cost: 1, ID: k}}
		cmds[i] = evalCmd(context.Background(), s.scriptRuns(r)[0], true, "", modeTake, r, nil)
	}
	sendCmds(node, cmds, joinByNode)
	return cmds
}

// sendCmds sends cmds as one batch on the queue of the node whose client
// is node, as its flusher does, joined as mode says.
func sendCmds(node *redis.Client, cmds []onceCmd, mode joinMode) {
	c := newCall(len(cmds))
	items := make([]queued, len(cmds))
	for i, cmd := range cmds {
		items[i] = queued{ctx: context.Background(), cmd: cmd, call: c, i: i}
	}
	q := &nodeQueue{client: node, pipe: node.Pipeline(), join: mode}
	q.send(&sender{}, items)
}

// shards returns the clients of c's masters and replicas, once c's slot map
// lists replicas (a cluster just made lists them when they are in sync).
func shards(t *testing.T, c *redis.ClusterClient) (masters, replicas []*redis.Client) {
	t.Helper()
	var mu sync.Mutex // ForEachShard calls at once
	for range 100 {
		masters, replicas = nil, nil
		err := c.ForEachShard(t.Context(), func(ctx context.Context, n *redis.Client) error {
			role, err := n.Do(ctx, "ROLE").Slice()
			mu.Lock()
			defer mu.Unlock()
			if err == nil && role[0] == "master" {
				masters = append(masters, n)
			} else if err == nil {
				replicas = append(replicas, n)
			}
			return err
		})
		if err == nil && len(masters) >= 2 && len(replicas) > 0 {
			return masters, replicas
		}
		time.Sleep(100 * time.Millisecond)
		c.ReloadState(t.Context())
	}
	t.Fatalf("%d masters, %d replicas", len(masters), len(replicas))
	return nil, nil
}

// TestBatchedCallElsewhere: a batched call of several slots that reaches a
// node that does not hold them (the client's slot map is out of date: a
// master that no longer serves the slots, a master that is a replica now)
// decides none of them, writes nothing, and fails each of its requests
// with errBatchElsewhere (which the store sends again alone, redirected),
// not with an error that would fail them as the node's: the first access
// of a token bucket (a read) fails as not local, the first of a
// concurrency limit (a write) as READONLY on a replica.
func TestBatchedCallElsewhere(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})
	t.Cleanup(func() { c.Close() })
	s := newRedisStore(t, c)
	masters, replicas := shards(t, c)
	loadScripts(t, c)
	a := masters[0].Options().Addr
	for _, p := range []bucket.Policy{{Rate: 1, Period: time.Hour, Burst: 9}, {Algorithm: bucket.Concurrency, Slots: 9, Lease: time.Minute}} {
		keys := keysOn(t, s, c, a, fmt.Sprint(p.Algorithm, "-client-"), 8) // on a, of 8 slots
		for _, to := range append(masters[1:], replicas...) {
			for i, cmd := range sendBatch(t, s, to, keys, p) {
				if cmd.Err() != errBatchElsewhere {
					t.Errorf("%s (%v) got take %d of a batch of %s's keys: %v; want errBatchElsewhere", to.Options().Addr, p.Algorithm, i, a, cmd.Err())
				}
			}
		}
		for i, cmd := range sendBatch(t, s, masters[0], keys, p) { // the first takes: nothing taken before
			if v, err := cmd.Result(); err != nil || v[1] != 1 || v[3] != 8 {
				t.Errorf("%v: take %d on its own node: %v, %v; want allowed, 8 remaining", p.Algorithm, i, v, err)
			}
		}
	}
}

// TestBatchedCallsAcrossSlots: decisions of many clients (each its own
// slot) that queue for one cluster node leave as a few calls, not one
// each, and are exact all the same; a request whose slot moved to another
// node since the client read its slot map, joined with others on the old
// node, is sent again alone, redirected, and decided once, on the new one;
// a call that finds no script cached runs as EVAL.
func TestBatchedCallsAcrossSlots(t *testing.T) {
	cl, c, s := ownCluster(t)
	loadScripts(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 1}
	take := func(key string) (bool, error) {
		d, err := s.Take(t.Context(), []bucket.Request{{Zone: "z", Key: key, Policy: p, Cost: 1}})
		return err == nil && d[0].Allowed, err
	}
	before := scriptRunCount(t, c)
	for round, want := range []int{300, 0} { // each client once, then refused
		var wg sync.WaitGroup
		var mu sync.Mutex
		allowed := 0
		for i := range 300 {
			wg.Go(func() {
				ok, err := take(fmt.Sprint("client-", i))
				if err != nil {
					t.Errorf("round %d, client %d: %v", round, i, err)
				}
				mu.Lock()
				allowed += map[bool]int{true: 1}[ok]
				mu.Unlock()
			})
		}
		wg.Wait()
		if allowed != want {
			t.Fatalf("round %d: %d of 300 clients allowed; want %d", round, allowed, want)
		}
	}
	calls := scriptRunCount(t, c) - before
	t.Logf("600 decisions of 300 clients in %d script calls", calls)
	if calls > 300 {
		t.Errorf("600 decisions of 300 clients made %d script calls; want fewer than one per 2 decisions", calls)
	}
	movedSlot(t, s, c, cl)
	// a call of several slots that finds no script cached is sent again
	// once as EVAL, its keys undeclared still
	m := redis.NewClient(&redis.Options{Addr: cl.Addrs()[2]})
	t.Cleanup(func() { m.Close() })
	if err := m.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	for i, cmd := range sendBatch(t, s, m, keysOn(t, s, c, cl.Addrs()[2], "noscript-", 8), p) {
		if v, err := cmd.Result(); err != nil || v[1] != 1 {
			t.Errorf("take %d of a batch after SCRIPT FLUSH: %v, %v; want allowed", i, v, err)
		}
	}
}

// movedSlot moves the slot of a client that has not been seen from the
// first master to the second, behind the back of c (whose slot map still says the old
// one), then has its take queue with 9 other clients' of the old master
// (paused meanwhile): all are decided once, the moved one on its new node.
func movedSlot(t *testing.T, s *Store, c *redis.ClusterClient, cl *redistest.Cluster) {
	var ids [2]string
	var nodes [2]*redis.Client
	for i, addr := range cl.Addrs()[:2] {
		nodes[i] = redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { nodes[i].Close() })
		ids[i] = nodes[i].ClusterMyID(t.Context()).Val()
	}
	from, to := 0, 1
	keys := keysOn(t, s, c, cl.Addrs()[from], "moved-", 11) // the first in flight, then the moved one, then others
	moved := s.key(bucket.Request{Zone: "z", Key: keys[1]})
	slot := int(nodes[from].ClusterKeySlot(t.Context(), moved).Val())
	for _, step := range []struct {
		node int
		args []any
	}{{to, []any{"importing", ids[from]}}, {from, []any{"migrating", ids[to]}}, {to, []any{"node", ids[to]}}, {from, []any{"node", ids[to]}}} {
		if err := nodes[step.node].Do(t.Context(), append([]any{"cluster", "setslot", slot}, step.args...)...).Err(); err != nil {
			t.Fatalf("cluster setslot %d %v: %v", slot, step.args, err)
		}
	}
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 1}
	srv := cl.Server(cl.Addrs()[from])
	srv.Pause()
	var wg sync.WaitGroup
	errs := make([]error, len(keys))
	for i, k := range keys {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d, err := s.Take(ctx, []bucket.Request{{Zone: "z", Key: k, Policy: p, Cost: 1}})
			if err == nil && !d[0].Allowed {
				err = fmt.Errorf("refused")
			}
			errs[i] = err
		})
		if i == 0 {
			time.Sleep(100 * time.Millisecond) // in flight: the others queue behind it
		}
	}
	time.Sleep(200 * time.Millisecond)
	srv.Resume()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("client %s (moved: %v): %v", keys[i], i == 1, err)
		}
	}
	if n := nodes[to].Exists(t.Context(), moved).Val(); n != 1 {
		t.Errorf("the moved client's bucket is not on its new node")
	}
	if d, err := s.Take(t.Context(), []bucket.Request{{Zone: "z", Key: keys[1], Policy: p, Cost: 1}}); err != nil || d[0].Allowed {
		t.Errorf("the moved client's second take: %v, %v; want refused (decided once)", d, err)
	}
}

// TestBatchedCallMigrating: while a client's slot migrates, the second key
// of its request may have moved already, and the request fails on it, in
// a call of several slots, after it touched its first key. It is sent
// again (errBatchElsewhere) only when that cannot count twice: a take
// (whose cleanup of expired entries finds nothing the second time), a
// release or a refund by id; a sliding-log refund without id, which gave
// back its first key by rank, fails as in a call of its own. Once the
// migration ends and the request is sent again as the store would, each
// key was charged or given back once, never twice; the other client's
// request in the call is decided all the same.
func TestBatchedCallMigrating(t *testing.T) {
	cl, c, s := ownCluster(t)
	loadScripts(t, c)
	ctx := t.Context()
	var nodes [2]*redis.Client
	for i := range nodes {
		nodes[i] = redis.NewClient(&redis.Options{Addr: cl.Addrs()[i]})
		t.Cleanup(func() { nodes[i].Close() })
	}
	log := bucket.Policy{Algorithm: bucket.SlidingWindowLog, Rate: 100, Period: time.Hour}
	lease := bucket.Policy{Algorithm: bucket.Concurrency, Slots: 100, Lease: time.Hour}
	for _, tc := range []struct {
		name  string
		mode  scriptMode
		id    string
		p     bucket.Policy
		cost  int64
		again bool  // sent again: errBatchElsewhere
		want  int64 // each key's members once the request counted once (2 requests before)
	}{
		{"log refund without id", modeRefund, "", log, 3, false, 3},
		{"log refund by id", modeRefund, "r", log, 3, true, 3},
		{"log take", modeTake, "t", log, 3, true, 9},
		{"lease release", modeRelease, "r", lease, 1, true, 1},
		{"lease take", modeTake, "t", lease, 1, true, 3},
	} {
		keys := keysOn(t, s, c, cl.Addrs()[0], strings.ReplaceAll(tc.name, " ", "-")+"-", 2)
		req := func(key, id string) []bucket.Request {
			return []bucket.Request{{Zone: "z1", Key: key, Policy: tc.p, Cost: tc.cost, ID: id}, {Zone: "z2", Key: key, Policy: tc.p, Cost: tc.cost, ID: id}}
		}
		reqs, other := req(keys[0], tc.id), req(keys[1], "o")
		for _, r := range [][]bucket.Request{req(keys[0], "r"), req(keys[0], "p"), other} {
			if _, err := s.Take(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		k1, k2 := s.key(reqs[0]), s.key(reqs[1])
		slot := nodes[0].ClusterKeySlot(ctx, k1).Val()
		migrate(t, nodes, slot, k2) // k2 moved, k1 not yet
		cmd := evalCmd(ctx, s.scriptRuns(reqs)[0], true, "", tc.mode, reqs, nil)
		cmdO := evalCmd(ctx, s.scriptRuns(other)[0], true, "", tc.mode, other, nil)
		sendCmds(nodes[0], []onceCmd{cmd, cmdO}, joinByNode)
		if again := cmd.Err() == errBatchElsewhere; again != tc.again || cmd.Err() == nil {
			t.Errorf("%s: %v; want sent again: %v", tc.name, cmd.Err(), tc.again)
		}
		if err := cmdO.Err(); err != nil {
			t.Errorf("%s: the other client's request in the call: %v", tc.name, err)
		}
		migrate(t, nodes, slot, "") // the rest moves, the slot is the second master's
		if tc.again {
			if err := s.resend(ctx, s.scriptRuns(reqs)[0], cmd, "", tc.mode, reqs).Err(); err != nil {
				t.Fatalf("%s: sent again: %v", tc.name, err)
			}
		}
		for _, k := range []string{k1, k2} {
			n := nodes[1].ZCard(ctx, k).Val()
			if tc.again && n != tc.want || !tc.again && (n < tc.want || n > 6) {
				t.Errorf("%s: %d members in %s; want %d (counted once)", tc.name, n, k, tc.want)
			}
		}
	}
}

// migrate moves slot from the first of nodes to the second: key alone,
// leaving the slot migrating, or (key "") the rest of it, and the slot.
func migrate(t *testing.T, nodes [2]*redis.Client, slot int64, key string) {
	t.Helper()
	ctx := t.Context()
	a, b := nodes[0], nodes[1]
	port := strings.Split(b.Options().Addr, ":")[1]
	steps := [][]any{
		{b, "cluster", "setslot", slot, "importing", a.ClusterMyID(ctx).Val()},
		{a, "cluster", "setslot", slot, "migrating", b.ClusterMyID(ctx).Val()},
		{a, "migrate", "127.0.0.1", port, key, 0, 5000},
	}
	if key == "" {
		steps = nil
		for _, k := range a.ClusterGetKeysInSlot(ctx, int(slot), 1000).Val() {
			steps = append(steps, []any{a, "migrate", "127.0.0.1", port, k, 0, 5000})
		}
		steps = append(steps, []any{b, "cluster", "setslot", slot, "node", b.ClusterMyID(ctx).Val()},
			[]any{a, "cluster", "setslot", slot, "node", b.ClusterMyID(ctx).Val()})
	}
	for _, step := range steps {
		if err := step[0].(*redis.Client).Do(ctx, step[1:]...).Err(); err != nil {
			t.Fatalf("%v: %v", step[1:], err)
		}
	}
}

// TestNoScriptKeepsOrder: on a node that lost its scripts (SCRIPT FLUSH:
// as after a restart or a promotion), a take of client X joined with
// another client's, queued after a release of X alone in its call, is
// decided after the release, not before: the calls that found no script
// are sent again in their order (a concurrency limit of 1: the take is
// allowed only once the release ran).
func TestNoScriptKeepsOrder(t *testing.T) {
	cl, c, s := ownCluster(t)
	addr := cl.Addrs()[0]
	m := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { m.Close() })
	p := bucket.Policy{Algorithm: bucket.Concurrency, Slots: 1, Lease: time.Minute}
	for round := range 3 {
		ks := keysOn(t, s, c, addr, fmt.Sprint("order-", round, "-"), 3)
		req := func(k, id string) []bucket.Request {
			return []bucket.Request{{Zone: "z", Key: k, Policy: p, Cost: 1, ID: id}}
		}
		if d, err := s.Take(t.Context(), req(ks[0], "a")); err != nil || !d[0].Allowed {
			t.Fatal(d, err)
		}
		if err := m.ScriptFlush(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		cl.Server(addr).Pause()
		var wg sync.WaitGroup
		var take []bucket.Decision
		var errTake, errRelease error
		for i, f := range []func(){
			func() { s.Take(t.Context(), req(ks[2], "z")) }, // in flight: the others queue
			func() { errRelease = s.Release(t.Context(), req(ks[0], "a")) },
			func() { take, errTake = s.Take(t.Context(), req(ks[0], "b")) },
			func() { s.Take(t.Context(), req(ks[1], "y")) }, // joins X's take
		} {
			wg.Go(f)
			time.Sleep(map[bool]time.Duration{true: 100, false: 30}[i == 0] * time.Millisecond)
		}
		cl.Server(addr).Resume()
		wg.Wait()
		if errRelease != nil || errTake != nil || !take[0].Allowed {
			t.Fatalf("round %d: release %v; the take queued after it: %v, %v; want allowed", round, errRelease, take, errTake)
		}
	}
}

// BenchmarkRedisScriptCluster measures what a token-bucket decision costs
// a cluster master (redis-µs/op, from INFO commandstats), in batches of 8
// decisions of 8 clients (8 slots): by tag, each its own call (as before
// batched calls across slots), and by node, one call that declares no keys.
func BenchmarkRedisScriptCluster(b *testing.B) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(b)})
	b.Cleanup(func() { c.Close() })
	s := newRedisStore(b, c)
	m, err := c.MasterForKey(b.Context(), "x")
	if err != nil {
		b.Fatal(err)
	}
	keys := keysOn(b, s, c, m.Options().Addr, "bench-", 1024)
	p := bucket.Policy{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
	sendBatch(b, s, m, keys[:8], p) // the script cached
	for _, mode := range []joinMode{joinByTag, joinByNode} {
		b.Run(map[joinMode]string{joinByTag: "by_tag", joinByNode: "by_node"}[mode], func(b *testing.B) {
			before := evalshaUsec(b, m)
			i := 0
			for b.Loop() {
				cmds := make([]onceCmd, 8)
				for j := range cmds {
					r := []bucket.Request{{Zone: "z", Key: keys[(i+j)%len(keys)], Policy: p, Cost: 1}}
					cmds[j] = evalCmd(context.Background(), s.scriptRuns(r)[0], true, "", modeTake, r, nil)
				}
				sendCmds(m, cmds, mode)
				i += 8
			}
			after := evalshaUsec(b, m)
			if calls := after[1] - before[1]; calls > 0 {
				b.ReportMetric(float64(after[0]-before[0])/float64(b.N*8), "redis-µs/decision")
				b.ReportMetric(float64(b.N*8)/float64(calls), "decisions/call")
			}
		})
	}
}
