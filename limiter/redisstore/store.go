package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	joinErrs "github.com/caddy-ratelimit/caddy-rate-limit/internal/errs"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

// DefaultKeyPrefix starts every Redis key of a Store unless set.
const DefaultKeyPrefix = "rl:"

// scripts are the Lua scripts, by algorithm.
var scripts = [...]*luaScript{
	bucket.TokenBucket:          newLuaScript(luascripts.TokenBucket),
	bucket.FixedWindow:          newLuaScript(luascripts.FixedWindow),
	bucket.SlidingWindowLog:     newLuaScript(luascripts.SlidingWindowLog),
	bucket.SlidingWindowCounter: newLuaScript(luascripts.SlidingWindowCounter),
	bucket.LeakyBucket:          newLuaScript(luascripts.LeakyBucket),
	bucket.Concurrency:          newLuaScript(luascripts.Concurrency),
	bucket.Quota:                newLuaScript(luascripts.Quota),
}

// Each script takes 6 arguments per key and answers 5 integers per key.
const (
	argsPerKey  = 6
	replyPerKey = 5
)

// Store keeps buckets in Redis (standalone, Sentinel or Cluster), so
// that every Caddy instance using the same Redis enforces one limit. Each
// decision is one Lua script run, atomic in Redis, on the server's clock.
//
// A bucket's key is prefix + "{" + digest of the client key + "}:" + zone,
// and a letter for other algorithms than the token bucket (see RedisKey):
// the raw client key is not stored, keys have a bounded length, and the hash
// tag is the digest, so a client cannot pick the hash slot, while zones keyed
// by the same client share one slot and one script run.
type Store struct {
	client   redis.UniversalClient
	prefix   string
	cluster  bool
	breakers *nodeBreakers
	batch    *batcher         // the queues of automatic pipelining, one per node
	now      func() time.Time // the breakers' clock
	closed   chan struct{}    // closed by Close: stops forgetLoop
	close    sync.Once
	forgetMu sync.Mutex
	absent   map[string]bool // the nodes missing from the slot map at the last forgetGone
}

// Circuit breakers, one per Redis node: after BreakerFailures consecutive
// failures (see Unavailable) the node is skipped for BreakerCooldown, then
// probed by one call at a time.
const (
	BreakerFailures = 3
	BreakerCooldown = 2 * time.Second
)

// New returns a store on client, whose keys start with prefix
// (DefaultKeyPrefix when empty). Close closes the client.
func New(client redis.UniversalClient, prefix string) (*Store, error) {
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("key prefix %q: must not contain { or }", prefix)
	}
	_, cluster := client.(*redis.ClusterClient)
	join := joinNone                                 // a client of another kind (a ring of shards, a wrapper): no batched calls
	if _, single := client.(*redis.Client); single { // standalone or Sentinel
		join = joinAny
	} else if cluster {
		join = joinByNode
	}
	s := &Store{client: client, prefix: prefix, cluster: cluster, now: time.Now, batch: newBatcher(join),
		breakers: &nodeBreakers{threshold: BreakerFailures, cooldown: BreakerCooldown, byNode: map[string]*Breaker{}},
		closed:   make(chan struct{}),
	}
	if cluster {
		go s.forgetLoop(forgetEvery)
	}
	return s, nil
}

// OnBreaker sets f to be called when the breaker of a node opens or
// closes; node is "" outside a cluster. Call it before the store is used.
func (s *Store) OnBreaker(f func(node string, open bool)) {
	s.breakers.changed = f
}

// OnForget sets f to be called when the store forgets a cluster node that
// no longer serves slots, with its breaker (see forgetGone). Call it
// before the store is used.
func (s *Store) OnForget(f func(node string)) {
	s.breakers.forgotten = f
}

// Breaker is the circuit breaker of node ("" outside a cluster).
func (s *Store) Breaker(node string) *Breaker {
	return s.breakers.get(node)
}

// Available reports whether the breakers of the nodes that hold reqs'
// keys are closed: calls to them are sent.
func (s *Store) Available(ctx context.Context, reqs []bucket.Request) bool {
	return !s.breakers.anyOpen(s.nodes(ctx, s.scriptRuns(reqs)))
}

// Take charges the buckets of reqs on the Redis server's clock, all or
// nothing (see Store.Take).
func (s *Store) Take(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	return s.take(ctx, "", reqs)
}

// TakeAt is Take at an explicit time instead of the server's clock.
func (s *Store) TakeAt(ctx context.Context, now time.Time, reqs []bucket.Request) ([]bucket.Decision, error) {
	return s.take(ctx, strconv.FormatInt(now.UnixMicro(), 10), reqs)
}

// Close stops the pipelining queues and closes the Redis client.
func (s *Store) Close() error {
	s.close.Do(func() { close(s.closed) })
	s.batch.close()
	return s.client.Close()
}

// scriptRun is one run of an algorithm's script: the requests of that
// algorithm whose keys share a hash slot, by their index in the requests
// that scriptRuns grouped, and their Redis keys, in the same order. args
// is room for its command's arguments (see evalCmd), and reply, once run
// has run it, the script's reply. flags, in a refund, are the keys' flags
// in the same order (their takes': see takenFlag); nil otherwise.
type scriptRun struct {
	pooled *oneRun // the oneRun it is in, from oneRuns; nil for others
	script *luaScript
	idx    []int
	keys   []string
	args   []any
	reply  []int64
	flags  []string
}

// oneRun is the script run of a single request (the common case), with
// its key and the room for its arguments: one allocation for all three.
type oneRun struct {
	run  [1]scriptRun
	key  [1]string
	args [5 + 1 + argsPerKey]any
	cmd  redis.IntSliceCmd // the run's command (evalCmd)
}

// oneRuns are the oneRuns of takes that ended: a take's run is done with
// once its reply is decoded (the pipeline that carried it has answered,
// and nothing reads a command after its answer).
var oneRuns = sync.Pool{New: func() any { return new(oneRun) }}

// recycleRuns gives back the oneRun of runs, if any: none of runs may be
// read afterwards.
func recycleRuns(runs []scriptRun) {
	if len(runs) == 1 && runs[0].pooled != nil {
		one := runs[0].pooled
		*one = oneRun{}
		oneRuns.Put(one)
	}
}

// RefundError reports that a request refused by one zone was refused, but
// the tokens other zones took for it could not be given back. The
// decisions that come with it stand.
type RefundError struct{ Err error }

func (e *RefundError) Error() string { return "refunding zones of a refused request: " + e.Err.Error() }
func (e *RefundError) Unwrap() error { return e.Err }

// take decides reqs at now (Unix µs in decimal; "" for the server's
// clock): it groups them into script runs, runs them in one round trip and
// decodes the replies into decisions. Each run is all or nothing on its
// own: when one refused, take refunds the runs that charged their buckets,
// at the take's time, and if that fails, returns the decisions with a
// *RefundError. When a run fails (a cluster then reloads its slot map) or
// a reply is malformed, take returns the error and no decisions.
func (s *Store) take(ctx context.Context, now string, reqs []bucket.Request) ([]bucket.Decision, error) {
	var start time.Time // a budget knows its own
	if _, ok := ctx.(*budget); !ok {
		start = time.Now()
	}
	runs := s.scriptRuns(reqs)
	if err := s.run(ctx, runs, now, modeTake, reqs); err != nil {
		s.reloadTopology(err)
		if len(runs) > 1 { // all or nothing: the runs that charged give it back
			rctx, cancel := refundContext(ctx, start)
			defer cancel()
			if rerr := s.refund(rctx, now, runs, reqs); rerr != nil {
				err = fmt.Errorf("%w (and the zones that other nodes charged were not given back: %w)", err, rerr)
			}
		}
		return nil, err
	}
	decisions := make([]bucket.Decision, len(reqs))
	allowed := true
	for i, sr := range runs {
		ok, err := decode(runs[i].reply, sr.idx, reqs, decisions)
		if err != nil {
			return nil, err
		}
		allowed = allowed && ok
	}
	recycleRuns(runs) // a single run is never refunded
	if !allowed && len(runs) > 1 {
		rctx, cancel := refundContext(ctx, start)
		defer cancel()
		// At the take's time: a window may have turned since (see refund).
		if err := s.refund(rctx, now, runs, reqs); err != nil {
			return decisions, &RefundError{err}
		}
	}
	return decisions, nil
}

// refundContext is the context of the refund of a take that started at
// start under ctx: a time budget of its own, as long as the take's, even
// when the take's is spent.
func refundContext(ctx context.Context, start time.Time) (context.Context, context.CancelFunc) {
	if b, ok := ctx.(*budget); ok {
		return context.WithTimeout(context.Background(), b.deadline.Sub(b.start))
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(context.WithoutCancel(ctx))
	}
	return context.WithTimeout(context.WithoutCancel(ctx), deadline.Sub(start))
}

// reloadTopology asks a cluster client to reload the slot map after a
// network error: a failed master's replica may have taken over its slots,
// and go-redis would otherwise keep calling the dead node until its next
// periodic reload. Reloads are asynchronous and coalesced by go-redis.
func (s *Store) reloadTopology(err error) {
	c, ok := s.client.(*redis.ClusterClient)
	var replyErr redis.Error
	if ok && !errors.As(err, &replyErr) {
		c.ReloadState(context.Background())
	}
}

// firstIndex is the idx of a run of a single request; never modified.
var firstIndex = []int{0}

// scriptRuns groups reqs into script runs, one per algorithm: in
// standalone Redis, all keys of an algorithm in one run; in a cluster, one
// run per algorithm and hash tag (the client key's digest: see RedisKey),
// so that a run's keys share a slot. A request may carry its digest alone
// (a sync round's), so runs are told apart by the digest, never by Key.
func (s *Store) scriptRuns(reqs []bucket.Request) []scriptRun {
	if len(reqs) == 1 { // the common case, without the grouping
		r, one := reqs[0], oneRuns.Get().(*oneRun)
		one.key[0] = s.key(r)
		one.run[0] = scriptRun{pooled: one, script: scripts[min(int(r.Policy.Algorithm), len(scripts)-1)], idx: firstIndex,
			keys: one.key[:], args: one.args[:0]}
		return one.run[:]
	}
	type group struct {
		a   bucket.Algorithm
		tag [redisDigestBytes]byte
	}
	var runs []scriptRun
	byGroup := map[group]int{}
	for i, r := range reqs {
		g := group{a: r.Policy.Algorithm}
		if s.cluster {
			d := r.Digest()
			g.tag = [redisDigestBytes]byte(d[:redisDigestBytes])
		}
		j, ok := byGroup[g]
		if !ok {
			j = len(runs)
			byGroup[g] = j
			runs = append(runs, scriptRun{script: scripts[min(int(g.a), len(scripts)-1)]})
		}
		runs[j].idx = append(runs[j].idx, i)
		runs[j].keys = append(runs[j].keys, s.key(r))
	}
	return runs
}

// run runs the script runs with EVALSHA, each in its node's next pipeline
// (see batcher: automatic pipelining), and sets each run's reply.
// Commands that did not run are sent again alone: after NOSCRIPT as EVAL,
// after MOVED or ASK (or errBatchElsewhere) through the cluster client,
// which follows redirects.
// No script is sent twice (see onceCmd). Calls to a node whose breaker is
// open are not sent, but releases always are; the outcome of every call
// is recorded by its node's breaker. An error is a *NodeError.
func (s *Store) run(ctx context.Context, runs []scriptRun, now string, mode scriptMode, reqs []bucket.Request) error {
	// One run (the common case) needs no slices on the heap.
	var nodesOne [1]string
	var clientsOne [1]redis.Cmdable
	var cmdsOne [1]onceCmd
	var errsOne [1]error
	nodes, clients, cmds, errs := nodesOne[:], clientsOne[:], cmdsOne[:], errsOne[:]
	if len(runs) > 1 {
		nodes, clients = make([]string, len(runs)), make([]redis.Cmdable, len(runs))
		cmds, errs = make([]onceCmd, len(runs)), make([]error, len(runs))
	}
	s.route(ctx, runs, nodes, clients)
	if !givesBack(mode) {
		if err := s.breakers.admit(nodes, s.now()); err != nil {
			return err
		}
	}
	for i, sr := range runs {
		cmds[i] = evalCmd(ctx, sr, true, now, mode, reqs, sr.args)
	}
	if answered, err := s.batch.do(ctx, nodes, clients, cmds); err != nil {
		for i := range cmds {
			if answered[i] && cmds[i].Err() == nil { // ran: its charge may be given back
				runs[i].reply = cmds[i].Val()
			}
		}
		return s.timedOut(nodes, cmds, answered, err, mode)
	}
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && (isRedirect(err) || redis.HasErrorPrefix(err, "NOSCRIPT") || err == errBatchElsewhere) {
			cmd = s.resend(ctx, runs[i], cmd, now, mode, reqs)
			runs[i].reply, errs[i] = cmd.Result()
			s.breakers.record(nodes[i:i+1], []error{nil}, s.now(), true) // the node answered
			if err := errs[i]; err != nil {
				return &NodeError{Err: err} // from another node: counted by none
			}
			continue
		}
		runs[i].reply, errs[i] = cmd.Result()
	}
	s.breakers.record(nodes, errs, s.now(), !givesBack(mode))
	for i, err := range errs {
		if err != nil {
			return &NodeError{Node: nodes[i], Err: err}
		}
	}
	return nil
}

// givesBack reports whether mode gives back what was taken (a release of
// slots, a refund of tokens): such calls are sent whatever a node's breaker
// says, on every path, and only their successes count toward the breaker.
func givesBack(mode scriptMode) bool { return mode == modeRelease || mode == modeRefund }

// timedOut records, when a call's time is up before every reply came, the
// outcome of each node: its reply's for the nodes that answered, a failure
// for the others (for a release, only the successes count). It returns the
// error of the first node that did not answer.
func (s *Store) timedOut(nodes []string, cmds []onceCmd, answered []bool, err error, mode scriptMode) error {
	errs := make([]error, len(nodes))
	silent := ""
	for i, node := range nodes {
		errs[i] = err
		if answered[i] {
			errs[i] = cmds[i].Err() // answered: safe to read
		} else if silent == "" {
			silent = node
		}
	}
	s.breakers.record(nodes, errs, s.now(), !givesBack(mode))
	return &NodeError{Node: silent, Err: err}
}

// resend sends again, alone and through the client (which follows
// redirects), a command that did not run: one a node redirected (MOVED,
// ASK: its slot moved; or errBatchElsewhere, the same in a batched call),
// or one that found no script cached (NOSCRIPT: then as EVAL, with the
// script's source).
func (s *Store) resend(ctx context.Context, sr scriptRun, cmd onceCmd, now string, mode scriptMode, reqs []bucket.Request) onceCmd {
	sha := !redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT")
	cmd = evalCmd(ctx, sr, sha, now, mode, reqs, nil)
	_ = s.client.Process(ctx, cmd)
	if sha && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") { // moved to a node without the script
		cmd = evalCmd(ctx, sr, false, now, mode, reqs, nil)
		_ = s.client.Process(ctx, cmd)
	}
	return cmd
}

// isRedirect reports whether err is a MOVED or ASK reply.
func isRedirect(err error) bool {
	return redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")
}

// refund gives back the tokens of the runs that were charged (all of
// their keys allowed), since another run refused the request. Each run is
// refunded at its take's time: now when the take gave one, else the time
// its own reply gave (its node's clock, so that a refund finds the window
// it charged whatever the other nodes' clocks say), with each key's take
// (its reply's time and reset: see takenFlag). At the take's time a
// charge has not begun to drain: it is given back whole, exactly. Runs of
// one time share a round trip.
func (s *Store) refund(ctx context.Context, now string, runs []scriptRun, reqs []bucket.Request) error {
	var times []string
	charged := map[string][]scriptRun{}
	for _, sr := range runs {
		if len(sr.reply) != 2+replyPerKey*len(sr.idx) || sr.reply[1] != 1 { // not run, failed, or refused
			continue
		}
		at := now
		if at == "" {
			at = strconv.FormatInt(sr.reply[0], 10)
		}
		sr.flags = make([]string, len(sr.idx))
		for j := range sr.idx {
			sr.flags[j] = takenFlag(sr.reply[0], sr.reply[0]+sr.reply[2+replyPerKey*j+2])
		}
		if _, ok := charged[at]; !ok {
			times = append(times, at)
		}
		charged[at] = append(charged[at], sr)
	}
	var errs []error
	for _, at := range times {
		if err := s.run(ctx, charged[at], at, modeRefund, reqs); err != nil {
			errs = append(errs, err)
		}
	}
	return joinErrs.Join(errs...)
}

// Release gives back the concurrency slots that reqs took; requests of
// other algorithms are left alone.
func (s *Store) Release(ctx context.Context, reqs []bucket.Request) error {
	return s.leases(ctx, modeRelease, reqs)
}

// Renew extends the concurrency leases that reqs hold to a full lease from
// now, as long as they are held: a lease that expired or was reset is not
// made again. Requests of other algorithms are left alone.
func (s *Store) Renew(ctx context.Context, reqs []bucket.Request) error {
	return s.leases(ctx, modeRenew, reqs)
}

// leases runs the concurrency script in mode for the requests of reqs
// that hold slots.
func (s *Store) leases(ctx context.Context, mode scriptMode, reqs []bucket.Request) error {
	held := make([]bucket.Request, 0, len(reqs))
	for _, r := range reqs {
		if r.Policy.Algorithm == bucket.Concurrency {
			held = append(held, r)
		}
	}
	if len(held) == 0 {
		return nil
	}
	return s.run(ctx, s.scriptRuns(held), "", mode, held)
}

// Peek tells the state of req's bucket (see Store.Peek): its script runs
// with no cost, and for a concurrency limit, takes no slot.
func (s *Store) Peek(ctx context.Context, req bucket.Request) (bucket.Decision, error) {
	req.Cost = 0
	if req.Policy.Algorithm != bucket.TokenBucket { // a token bucket's id is a global zone's tag
		req.ID = ""
	}
	reqs := []bucket.Request{req}
	runs := s.scriptRuns(reqs)
	if err := s.run(ctx, runs, "", modePeek, reqs); err != nil {
		return bucket.Decision{}, err
	}
	decisions := make([]bucket.Decision, 1)
	_, err := decode(runs[0].reply, runs[0].idx, reqs, decisions)
	return decisions[0], err
}

// Reset drops req's bucket (see Store.Reset).
func (s *Store) Reset(ctx context.Context, req bucket.Request) error {
	return s.client.Del(ctx, append([]string{s.key(req)}, s.banKeys(req)...)...).Err()
}

// Ping checks that Redis answers (every master, in a cluster).
func (s *Store) Ping(ctx context.Context) error {
	if c, ok := s.client.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return n.Ping(ctx).Err()
		})
	}
	return s.client.Ping(ctx).Err()
}

// Client is the go-redis client a Store speaks through: a standalone
// Redis, a Cluster or a failover client.
type Client = redis.UniversalClient
