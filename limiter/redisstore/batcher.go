package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Automatic pipelining. Every decision is one or a few script commands;
// decisions of concurrent requests bound for the same Redis node leave
// together, as one pipeline on one of that node's connections:
//
//   - each node has a queue and one flusher goroutine;
//   - while the node has no batch in flight, a command is written at once
//     (the flusher wakes up and sends a pipeline of one);
//   - while a batch is in flight, commands queue, and the next batch takes
//     them all (at most maxBatch) when it returns.
//
// There is no timer: batching comes only from commands that arrive while
// the previous batch is in flight, so a lone request waits for nothing but
// a goroutine hand-off. This is Envoy's ratelimit "implicit pipelining"
// with no flush window, and rueidis's auto pipelining with go-redis's
// half-duplex pipelines: one write, then one read of all the replies.
//
// A command's caller waits for its batch, or until its context ends; a
// command whose context ended before its batch left is not sent at all.
// Each command of a batch gets its own reply or error: a failed batch
// fails each of its decisions on its own, and commands are never sent
// twice (they are onceCmds).

// maxBatch bounds a pipeline: Redis answers a pipeline in one go, so a
// huge one would hold the node (and every reply in it) for long.
const maxBatch = 256

// maxQueued bounds the commands waiting for one node: past it (a node far
// slower than the traffic), calls fail at once rather than pile up.
const maxQueued = 65536

var errQueueFull error = &bucket.NotRunError{Msg: "redis node queue full: the node does not keep up"}

// batcher holds the queues of a store's nodes, made on first use.
type batcher struct {
	mu     sync.Mutex
	queues map[string]*nodeQueue // by node address; "" outside a cluster
	closed bool
	join   joinMode // which commands batched calls may join (see joiner.go)
}

// call is one decision's commands, which may go to several nodes; done
// receives when the last of them has its reply. Calls are reused (calls):
// one whose caller gave up is not, since its reply may still come.
type call struct {
	pending  atomic.Int32
	done     chan struct{} // buffered: the last reply never waits
	answered []atomic.Bool // answered[i]: cmds[i] has its reply (or error)
	inline   [4]atomic.Bool
}

var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// newCall returns a call of n commands, none answered.
func newCall(n int) *call {
	c := calls.Get().(*call)
	if n <= len(c.inline) {
		c.answered = c.inline[:n]
	} else {
		c.answered = make([]atomic.Bool, n)
	}
	for i := range c.answered {
		c.answered[i].Store(false)
	}
	c.pending.Store(int32(n))
	return c
}

// queued is a command in a node's queue.
type queued struct {
	ctx  context.Context
	cmd  onceCmd
	call *call
	i    int // the command's index in its call
}

// nodeQueue is the queue of one node and the pipeline that sends it.
type nodeQueue struct {
	client redis.Cmdable   // the node's client
	pipe   redis.Pipeliner // a pipeline on client, used by the flusher alone
	join   joinMode        // see batcher
	mu     sync.Mutex
	wake   *sync.Cond
	items  []queued
	closed bool
}

// newBatcher returns the batcher of a store, whose batched calls join
// commands as join says (see joiner.go).
func newBatcher(join joinMode) *batcher {
	return &batcher{queues: map[string]*nodeQueue{}, join: join}
}

// queue returns the queue of node, whose connections client holds. A node
// whose client go-redis replaced (a node that left the cluster and came
// back) gets a new queue; the old one drains and stops.
func (b *batcher) queue(node string, client redis.Cmdable) (*nodeQueue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, redis.ErrClosed
	}
	q, ok := b.queues[node]
	if ok && q.client == client {
		return q, nil
	}
	if ok {
		q.close()
	}
	join := b.join
	if join == joinByNode && node == "" { // the cluster client's queue: it routes each command by its keys
		join = joinByTag
	}
	q = &nodeQueue{client: client, pipe: client.Pipeline(), join: join}
	q.wake = sync.NewCond(&q.mu)
	b.queues[node] = q
	go q.flush()
	return q, nil
}

// do sends cmds, cmds[i] to the node nodes[i] through clients[i], and waits
// for their replies, or until ctx ends (a budget: until its deadline). Then it returns ctx's error and
// which commands were answered; the others must not be read (they may
// still be answered), nor be sent again.
func (b *batcher) do(ctx context.Context, nodes []string, clients []redis.Cmdable, cmds []onceCmd) (answered []bool, err error) {
	c := newCall(len(cmds))
	for i, cmd := range cmds {
		q, err := b.queue(nodes[i], clients[i])
		if err == nil {
			err = b.enqueue(q, nodes[i], clients[i], queued{ctx: ctx, cmd: cmd, call: c, i: i})
		}
		if err != nil {
			cmd.SetErr(err)
			c.finish(i)
		}
	}
	done, expired := ctx.Done(), (<-chan time.Time)(nil)
	if b, ok := ctx.(*budget); ok { // no Done: a pooled timer for its deadline
		t := timers.Get().(*time.Timer)
		t.Reset(time.Until(b.deadline))
		defer func() { t.Stop(); timers.Put(t) }()
		expired = t.C
	}
	select {
	case <-c.done:
		calls.Put(c)
		return nil, nil
	case <-done:
	case <-expired:
	}
	answered = make([]bool, len(cmds))
	all := true
	for i := range answered {
		answered[i] = c.answered[i].Load()
		all = all && answered[i]
	}
	if all { // answered meanwhile
		<-c.done
		calls.Put(c)
		return nil, nil
	}
	return answered, cmp.Or(ctx.Err(), context.DeadlineExceeded) // c is not reused: its replies may still come
}

// enqueue pushes item on q, the queue of node; when forget closed q since
// it was looked up (its node left the slot map as a decision for it was on
// its way), on node's new queue instead: a command is refused as closed
// only when the store is.
func (b *batcher) enqueue(q *nodeQueue, node string, client redis.Cmdable, item queued) error {
	err := q.push(item)
	if errors.Is(err, redis.ErrClosed) {
		if q, err = b.queue(node, client); err == nil {
			err = q.push(item)
		}
	}
	return err
}

// finish records that the call's i-th command has its reply.
func (c *call) finish(i int) {
	c.answered[i].Store(true)
	if c.pending.Add(-1) == 0 {
		c.done <- struct{}{}
	}
}

// push queues an item and wakes the flusher.
func (q *nodeQueue) push(item queued) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return redis.ErrClosed
	case len(q.items) >= maxQueued:
		return errQueueFull
	}
	q.items = append(q.items, item)
	q.wake.Signal()
	return nil
}

// flush sends the queue's batches, one at a time, until the queue closes.
func (q *nodeQueue) flush() {
	batch := make([]queued, 0, maxBatch)
	s := &sender{live: make([]queued, 0, maxBatch)}
	for {
		q.mu.Lock()
		for len(q.items) == 0 && !q.closed {
			q.wake.Wait()
		}
		if len(q.items) == 0 { // closed and drained
			q.mu.Unlock()
			return
		}
		batch = q.take(batch)
		q.mu.Unlock()
		q.send(s, batch)
		clear(batch) // let go of the commands
	}
}

// take moves the oldest items of the queue, at most maxBatch, into batch
// (whose items were cleared) and returns it: the queue's own array when
// it holds no more than a batch (batch's becomes the queue's: no copy),
// else a copy of the first maxBatch, the queue going on from the next
// (no move of the rest: draining a deep queue costs what it holds, not
// its square). The caller holds q.mu.
func (q *nodeQueue) take(batch []queued) []queued {
	if len(q.items) <= maxBatch {
		batch, q.items = q.items, batch[:0]
		return batch
	}
	batch = append(batch[:0], q.items[:maxBatch]...)
	clear(q.items[:maxBatch])
	q.items = q.items[maxBatch:]
	return batch
}

// send runs one batch as a pipeline, leaving out the commands whose caller
// gave up, the others joined into batched calls where they can (see
// joiner.go), and completes every call. The pipeline runs under the latest
// deadline of the batch, and no caller's cancellation: one leaving caller
// does not fail the others.
func (q *nodeQueue) send(s *sender, batch []queued) {
	var newest context.Context
	var latest time.Time
	unbounded := false
	live := s.live[:0]
	now := time.Now() // for the budgets: one clock reading per batch
	for _, it := range batch {
		if err := ctxErr(it.ctx, now); err != nil {
			it.cmd.SetErr(fmt.Errorf("%w: %w", errNotSent, err))
			continue
		}
		d, ok := it.ctx.Deadline()
		unbounded = unbounded || !ok
		if ok && d.After(latest) {
			latest = d
		}
		newest = it.ctx
		live = append(live, it)
	}
	if newest != nil {
		us := s.join(live, q.join)
		for _, u := range us {
			_ = q.pipe.Process(newest, u.cmd)
		}
		// A budget's values are none: the batch needs no parent of the
		// callers'.
		parent := context.WithoutCancel(newest)
		if _, ok := newest.(*budget); ok {
			parent = context.Background()
		}
		ctx, cancel := parent, context.CancelFunc(func() {})
		if !unbounded {
			ctx, cancel = context.WithDeadline(ctx, latest)
		}
		_, err := q.pipe.Exec(ctx) // each command holds its own reply or error
		unanswered(us, err)
		evalAgain(ctx, q.pipe, us)
		cancel()
		for _, u := range us {
			u.answer()
		}
		s.reset()
	}
	for _, it := range batch {
		it.call.finish(it.i)
	}
	clear(live) // let go of the commands
	s.live = live[:0]
}

// ctxErr is ctx.Err(), a budget's at now.
func ctxErr(ctx context.Context, now time.Time) error {
	if b, ok := ctx.(*budget); ok {
		if b.expired(now) {
			return context.DeadlineExceeded
		}
		return nil
	}
	return ctx.Err()
}

// sender is the room a flusher's batches reuse.
type sender struct {
	live []queued // the commands of a batch whose callers wait
	joiner
}

// forget stops the queues of the nodes that drop says to drop, once they
// are drained, and drops them: a node that comes back gets a new one.
func (b *batcher) forget(drop func(node string) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for node, q := range b.queues {
		if drop(node) {
			q.close()
			delete(b.queues, node)
		}
	}
}

// close stops the flushers once their queues are drained.
func (b *batcher) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for _, q := range b.queues {
		q.close()
	}
}

// close stops the queue's flusher once the queue is drained.
func (q *nodeQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.wake.Broadcast()
	q.mu.Unlock()
}
