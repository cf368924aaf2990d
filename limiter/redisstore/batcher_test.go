package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// pipelineCounter is a go-redis hook that counts the pipelines a client
// sends and the largest one.
type pipelineCounter struct {
	pipelines, single, largest atomic.Int64
}

func (h *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.single.Add(1)
		return next(ctx, cmd)
	}
}
func (h *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		for n := int64(len(cmds)); ; {
			old := h.largest.Load()
			if n <= old || h.largest.CompareAndSwap(old, n) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

// takeConcurrently runs n Takes at once, one key each, and returns their
// errors.
func takeConcurrently(s *Store, n int, req func(i int) bucket.Request) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, errs[i] = s.Take(ctx, []bucket.Request{req(i)})
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

// TestAutoPipelining: concurrent decisions leave in shared pipelines of at
// most maxBatch commands, every one decided; a lone decision leaves at once,
// in a pipeline of its own.
func TestAutoPipelining(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t), PoolSize: 4})
	hook := &pipelineCounter{}
	c.AddHook(hook)
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 3}
	for _, key := range []string{"warm", "lone"} { // the first connects and loads the script
		hook.pipelines.Store(0)
		hook.largest.Store(0)
		if _, err := s.Take(t.Context(), []bucket.Request{{Zone: "z", Key: key, Policy: p, Cost: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if hook.pipelines.Load() != 1 || hook.largest.Load() != 1 {
		t.Fatalf("a lone decision: %d pipelines, largest %d; want one of 1", hook.pipelines.Load(), hook.largest.Load())
	}
	const n = 1000
	errs := takeConcurrently(s, n, func(i int) bucket.Request {
		return bucket.Request{Zone: "z", Key: fmt.Sprint("k", i), Policy: p, Cost: 1}
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
	}
	pipes, largest := hook.pipelines.Load()-1, hook.largest.Load()
	t.Logf("%d concurrent decisions in %d pipelines, the largest of %d", n, pipes, largest)
	if pipes >= n/2 {
		t.Errorf("%d concurrent decisions left in %d pipelines; want them batched", n, pipes)
	}
	if largest > maxBatch {
		t.Errorf("a pipeline of %d commands; want at most %d", largest, maxBatch)
	}
	// Each key was charged exactly once.
	for _, i := range []int{0, n / 2, n - 1} {
		d, err := s.Peek(t.Context(), bucket.Request{Zone: "z", Key: fmt.Sprint("k", i), Policy: p})
		if err != nil || d.Remaining != 2 {
			t.Fatalf("key k%d: remaining %d (%v); want 2", i, d.Remaining, err)
		}
	}
}

// TestBatchFailsEachOnItsOwn: one decision whose script fails shares
// pipelines with others, which are decided all the same.
func TestBatchFailsEachOnItsOwn(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t), PoolSize: 2})
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 3}
	bad := bucket.Request{Zone: "z", Key: "bad", Policy: p, Cost: 1}
	if err := c.HSet(t.Context(), s.key(bad), "not", "a bucket").Err(); err != nil {
		t.Fatal(err)
	}
	errs := takeConcurrently(s, 200, func(i int) bucket.Request {
		if i%50 == 0 {
			return bad
		}
		return bucket.Request{Zone: "z", Key: fmt.Sprint("ok", i), Policy: p, Cost: 1}
	})
	for i, err := range errs {
		switch {
		case i%50 == 0 && (err == nil || Unavailable(err)):
			t.Errorf("the bad key's decision %d: %v; want its script error", i, err)
		case i%50 != 0 && err != nil:
			t.Errorf("decision %d, batched with a failing one: %v", i, err)
		}
	}
}

// TestBatcherCallerTimesOut: a caller waits for its batch no longer than
// its context or its budget, even behind a batch stuck on a hung node.
func TestBatcherCallerTimesOut(t *testing.T) {
	srv := redistest.NewServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}})
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 3}
	if _, err := s.Take(t.Context(), []bucket.Request{{Zone: "z", Key: "warm", Policy: p, Cost: 1}}); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	errs := make(chan time.Duration, 4)
	for i := range 4 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			if i%2 == 1 { // a decision's budget, as takeRedis gives: no timer of its own
				ctx = newBudget(150 * time.Millisecond)
			}
			start := time.Now()
			_, err := s.Take(ctx, []bucket.Request{{Zone: "z", Key: fmt.Sprint("t", i), Policy: p, Cost: 1}})
			if err == nil {
				t.Error("a decision on a hung Redis succeeded")
			}
			errs <- time.Since(start)
		}()
	}
	for range 4 {
		if took := <-errs; took > time.Second {
			t.Errorf("a caller waited %s; want about its 150ms", took)
		}
	}
}

// BenchmarkQueueTake: the flusher draining a full queue (maxQueued
// commands, as behind a node slower than its traffic) batch by batch.
func BenchmarkQueueTake(b *testing.B) {
	q := &nodeQueue{}
	batch := make([]queued, 0, maxBatch)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		q.items = make([]queued, maxQueued)
		b.StartTimer()
		for len(q.items) > 0 {
			batch = q.take(batch)
			clear(batch)
		}
	}
}

// TestEnqueueAfterForget: a decision that looked up its node's queue just
// before forget closed it (its node had left the slot map) goes on the
// node's new queue and is answered, instead of failing as if the store were
// closed (which would count toward the node's breaker and send the request
// to on_store_error).
func TestEnqueueAfterForget(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	t.Cleanup(func() { c.Close() })
	b := newBatcher(joinAny)
	t.Cleanup(b.close)
	q, err := b.queue("n", c)
	if err != nil {
		t.Fatal(err)
	}
	b.forget(func(string) bool { return true })
	cmd := onceCmd{redis.NewIntSliceCmd(t.Context(), "eval", "return {1, 2}", 0)}
	call := newCall(1)
	if err := b.enqueue(q, "n", c, queued{ctx: t.Context(), cmd: cmd, call: call}); err != nil {
		t.Fatalf("a command for a forgotten queue: %v; want it queued on the node's new one", err)
	}
	<-call.done
	if v, err := cmd.Result(); err != nil || len(v) != 2 {
		t.Fatalf("reply %v, %v", v, err)
	}
	b.close()
	if err := b.enqueue(q, "n", c, queued{ctx: t.Context(), cmd: cmd, call: newCall(1)}); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("after the store closed: %v; want ErrClosed", err)
	}
}

// TestBatchedCalls: concurrent decisions of one node leave as few script
// calls (see joiner.go), and stay exact: requests for the same bucket in
// one call are decided in turn, each seeing what the previous took, so
// that of 300 concurrent requests for a bucket of 100, exactly 100 pass;
// other clients' decisions in the same calls are theirs. In a cluster,
// where a call holds one hash slot, a client's requests still join.
func TestBatchedCalls(t *testing.T) {
	srv := redistest.NewServer(t)
	clients := map[string]redis.UniversalClient{
		"standalone": redis.NewClient(&redis.Options{Addr: srv.Addr}),
		// a cluster of its own: the script calls of the shared one are
		// other tests' too
		"cluster": redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.NewClusterOf(t, 3, 0).Addrs()}),
	}
	for name, c := range clients {
		t.Run(name, func(t *testing.T) {
			s := newRedisStore(t, c)
			p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 100}
			for i := range 32 { // load the script on every node first (NOSCRIPT: each decision alone, as EVAL)
				if _, err := s.Take(t.Context(), []bucket.Request{{Zone: "warm", Key: fmt.Sprint(i), Policy: p, Cost: 1}}); err != nil {
					t.Fatal(err)
				}
			}
			before := scriptRunCount(t, c)
			errs := make([]error, 400)
			allowed := make([]bool, 400)
			var wg sync.WaitGroup
			for i := range 400 {
				wg.Go(func() {
					key := "hot" // 300 requests of one client, 100 of others
					if i%4 == 3 {
						key = fmt.Sprint("other-", i)
					}
					d, err := s.Take(t.Context(), []bucket.Request{{Zone: "z", Key: key, Policy: p, Cost: 1}})
					errs[i] = err
					allowed[i] = err == nil && d[0].Allowed
				})
			}
			wg.Wait()
			hot, others := 0, 0
			for i, err := range errs {
				if err != nil {
					t.Fatalf("decision %d: %v", i, err)
				}
				switch {
				case i%4 == 3 && allowed[i]:
					others++
				case i%4 != 3 && allowed[i]:
					hot++
				}
			}
			if hot != 100 || others != 100 {
				t.Fatalf("allowed: %d of 300 for a bucket of 100, %d of 100 other clients; want 100 and 100", hot, others)
			}
			calls := scriptRunCount(t, c) - before
			t.Logf("400 decisions in %d script calls", calls)
			if calls > 300 {
				t.Errorf("400 concurrent decisions made %d script calls; want them batched", calls)
			}
		})
	}
}

// scriptRunCount is the number of EVALSHA and EVAL calls the Redis servers
// behind c ran so far (every master of a cluster).
func scriptRunCount(t *testing.T, c redis.UniversalClient) int {
	t.Helper()
	count := func(info string) int {
		n := 0
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if _, rest, ok := strings.Cut(info, cmd); ok {
				var k int
				fmt.Sscanf(rest, "%d", &k)
				n += k
			}
		}
		return n
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		total := 0
		err := cc.ForEachMaster(t.Context(), func(ctx context.Context, n *redis.Client) error {
			info, err := n.Info(ctx, "commandstats").Result()
			mu.Lock()
			total += count(info)
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return total
	}
	info, err := c.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	return count(info)
}

// TestBatchedCallNoScript: a batched call that finds no script cached (a
// restarted or failed-over node) is sent again once, as EVAL with the
// script's source, not once per request: 99 requests that queued behind a
// paused server's first command cost one EVAL, not 99 (each carrying the
// whole script).
func TestBatchedCallNoScript(t *testing.T) {
	srv := redistest.NewServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	s := newRedisStore(t, c)
	if err := c.Ping(t.Context()).Err(); err != nil { // connected before the pause
		t.Fatal(err)
	}
	srv.Pause()
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 1000}
	var wg sync.WaitGroup
	errs := make([]error, 100)
	for i := range 100 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, errs[i] = s.Take(ctx, []bucket.Request{{Zone: "z", Key: "k", Policy: p, Cost: 1}})
		})
	}
	time.Sleep(200 * time.Millisecond) // the first command in flight, the others queued
	srv.Resume()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
	}
	d, err := s.Peek(t.Context(), bucket.Request{Zone: "z", Key: "k", Policy: p})
	if err != nil || d.Remaining != 900 {
		t.Fatalf("remaining %d (%v); want 900: each decision charged once", d.Remaining, err)
	}
	info, err := c.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(info, "cmdstat_eval:calls=")
	var evals int
	fmt.Sscanf(rest, "%d", &evals)
	if evals > 3 {
		t.Fatalf("%d EVALs after NOSCRIPT for 100 decisions in two batches; want at most 3", evals)
	}
}

// TestBatchedCallArgs: each request of a batched call is decided with its
// own arguments, though the script reuses the previous key's when they
// are the same: requests of one zone (the same rate, period and burst)
// with other costs, flags and ids get their own (a cost of 5 leaves 5 of
// 10; a leaky bucket's no-delay flag sets no delay; a sliding log's
// members are named by the request's own id).
func TestBatchedCallArgs(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.NewServer(t).Addr})
	t.Cleanup(func() { c.Close() })
	s := newRedisStore(t, c)
	for _, sc := range scripts {
		if err := c.ScriptLoad(t.Context(), sc.src.(string)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		p     bucket.Policy
		reqs  []bucket.Request // Key and Cost, ID, NoDelay set
		check func(t *testing.T, i int, reply []int64, r bucket.Request)
	}{
		{bucket.Policy{Rate: 1, Period: time.Hour, Burst: 10}, []bucket.Request{{Key: "a", Cost: 1}, {Key: "b", Cost: 5}, {Key: "c", Cost: 5}, {Key: "d", Cost: 2}},
			func(t *testing.T, i int, reply []int64, r bucket.Request) {
				if reply[3] != 10-r.Cost {
					t.Errorf("token bucket, cost %d: %d remaining; want %d", r.Cost, reply[3], 10-r.Cost)
				}
			}},
		{bucket.Policy{Algorithm: bucket.LeakyBucket, Rate: 1, Period: time.Hour, Burst: 10}, []bucket.Request{{Key: "a"}, {Key: "b", ID: "1"}, {Key: "c", ID: "1"}, {Key: "d"}},
			func(t *testing.T, i int, reply []int64, r bucket.Request) {
				if delayed := reply[6] > 0; delayed == r.Policy.NoDelay {
					t.Errorf("leaky bucket, request %d (no delay: %v): delay %d µs", i, r.Policy.NoDelay, reply[6])
				}
			}},
		{bucket.Policy{Algorithm: bucket.SlidingWindowLog, Rate: 10, Period: time.Hour}, []bucket.Request{{Key: "a", ID: "x"}, {Key: "b", ID: "y"}, {Key: "c", ID: "y"}, {Key: "d", ID: "z"}},
			func(t *testing.T, i int, reply []int64, r bucket.Request) {
				key := s.key(bucket.Request{Zone: "z", Key: r.Key, Policy: r.Policy})
				if m := c.ZRange(t.Context(), key, 0, -1).Val(); len(m) != 1 || m[0] != r.ID+":1" {
					t.Errorf("sliding log, request %d (id %s): members %v", i, r.ID, m)
				}
			}},
	} {
		var cmds []onceCmd
		for i := range tc.reqs {
			r := &tc.reqs[i]
			r.Zone, r.Policy, r.Key = "z", tc.p, fmt.Sprint(tc.p.Algorithm, "-", r.Key)
			r.Cost = max(r.Cost, 1)
			if tc.p.Algorithm == bucket.LeakyBucket { // a first request, so that the next one waits (or would)
				if _, err := s.Take(t.Context(), []bucket.Request{*r}); err != nil {
					t.Fatal(err)
				}
				r.Policy.NoDelay, r.ID = r.ID == "1", "" // the same id: only the flag differs
			}
			one := []bucket.Request{*r}
			cmds = append(cmds, evalCmd(t.Context(), s.scriptRuns(one)[0], true, "", modeTake, one, nil))
		}
		before := scriptRunCount(t, c)
		sendCmds(c, cmds, joinAny)
		if calls := scriptRunCount(t, c) - before; calls != 1 {
			t.Fatalf("%v: 4 requests in %d script calls; want 1", tc.p.Algorithm, calls)
		}
		for i, cmd := range cmds {
			reply, err := cmd.Result()
			if err != nil || reply[1] != 1 {
				t.Fatalf("%v request %d: %v, %v; want allowed", tc.p.Algorithm, i, reply, err)
			}
			tc.check(t, i, reply, tc.reqs[i])
		}
	}
}
