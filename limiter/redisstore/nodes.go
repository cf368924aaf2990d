package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// ErrBreakerOpen is the error of a call not sent because the circuit
// breaker of its Redis node is open.
var ErrBreakerOpen error = &bucket.NotRunError{Msg: "circuit breaker open after consecutive redis failures"}

// NodeError is a failed call to one Redis node: Node is the address of the
// cluster master the call went to, "" outside a cluster (one breaker for
// the whole Redis).
type NodeError struct {
	Node string
	Err  error
}

func (e *NodeError) Error() string {
	if e.Node == "" {
		return e.Err.Error()
	}
	return "redis node " + e.Node + ": " + e.Err.Error()
}

func (e *NodeError) Unwrap() error { return e.Err }

// Unavailable reports whether err says that Redis could not decide: no
// connection, a timeout, an open breaker, or a reply saying the server
// cannot serve now (loading, cluster down, a read-only replica, out of
// memory, busy with a long script, failing to persist, refusing our
// credentials, full of clients). Only these count toward a breaker. A
// canceled context is not one: the caller left. Any
// other error, such as a script error caused by the data of one request,
// is that request's problem: Redis is up.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrBreakerOpen) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if errors.Is(err, context.Canceled) { // the caller left: says nothing of Redis
		return false
	}
	if AuthFailed(err) {
		return true
	}
	var reply redis.Error
	if errors.As(err, &reply) && !errors.Is(err, redis.ErrClosed) {
		msg := reply.Error()
		for _, prefix := range []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "READONLY", "BUSY", "OOM",
			"NOREPLICAS", "MISCONF", "ERR max number of clients"} {
			if strings.HasPrefix(msg, prefix) {
				return true
			}
		}
		return false
	}
	// No reply: a connection, pool or timeout error. A malformed reply is
	// not one: Redis answered. (Replies are read as lists of integers:
	// another shape would be a go-redis parse error, which fails the rest
	// of its pipeline too and counts here; the scripts return integers
	// only, see common.lua.)
	return !errors.Is(err, errReply)
}

// authPrefixes start the replies of a Redis that refuses our credentials
// or their permissions: no AUTH (NOAUTH, and a command too long for an
// unauthenticated connection), a wrong password, an ACL user without the
// commands or keys it needs.
var authPrefixes = []string{"NOAUTH", "WRONGPASS", "NOPERM", "ERR Protocol error: unauthenticated"}

// AuthFailed reports whether err is Redis refusing our credentials or
// their permissions: a configuration to fix, which counts as unavailability.
func AuthFailed(err error) bool {
	var reply redis.Error
	if err == nil || !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	for _, prefix := range authPrefixes {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
}

// onceCmd is a command that go-redis must not send again after a network
// error: a script that may have run is never run twice. go-redis's cluster
// client retries network errors on its own (up to MaxRedirects, whatever
// MaxRetries says) unless the command says NoRetry. MOVED and ASK replies,
// which mean the script did not run, are still followed.
type onceCmd struct{ *redis.IntSliceCmd }

// NoRetry tells go-redis not to retry the command.
func (onceCmd) NoRetry() bool { return true }

// luaScript is a Lua script and its SHA-1, the name EVALSHA runs it by,
// both held as command arguments already (no conversion per call).
type luaScript struct {
	src, sha any
}

func newLuaScript(src string) *luaScript {
	sum := sha1.Sum([]byte(src))
	return &luaScript{src: src, sha: hex.EncodeToString(sum[:])}
}

// nodeBreakers are the circuit breakers of a Store, one per node, so
// that one dead shard sends only its own keys to the failure mode.
type nodeBreakers struct {
	threshold int
	cooldown  time.Duration
	mu        sync.Mutex
	byNode    map[string]*Breaker
	// changed, when set, is called when a node's breaker opens or closes.
	changed func(node string, open bool)
	// forgotten, when set, is called when a node's breaker is dropped.
	forgotten func(node string)
}

// forget drops the breakers of the nodes that drop says to drop.
func (nb *nodeBreakers) forget(drop func(node string) bool) {
	nb.mu.Lock()
	var gone []string
	for node := range nb.byNode {
		if drop(node) {
			delete(nb.byNode, node)
			gone = append(gone, node)
		}
	}
	nb.mu.Unlock()
	for _, node := range gone {
		if nb.forgotten != nil {
			nb.forgotten(node)
		}
	}
}

// forgetEvery is how often a cluster store forgets the nodes that no
// longer hold slots (see forgetGone).
const forgetEvery = time.Minute

// forgetGone drops the pipelining queue and the breaker of every node that
// no longer serves slots by the cluster's slot map (a master that failed
// over, or left), so that addresses that come and go (a cluster whose
// nodes get new addresses when they restart) leave nothing behind; the
// function set by OnForget hears of each. A node is dropped when it was
// missing from the map at this call and at the one before, so that a map
// read while another was coming in (a new master that this one does not
// list yet) drops nothing in use. ForEachMaster reloads the map (or falls
// back to the one the client has); outside a cluster, or without any map,
// it does nothing. A cluster store calls it every forgetEvery.
func (s *Store) forgetGone(ctx context.Context) {
	c, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	var mu sync.Mutex
	masters := map[string]bool{}
	err := c.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		masters[n.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	if err != nil || len(masters) == 0 {
		return
	}
	s.forgetMu.Lock()
	defer s.forgetMu.Unlock()
	absent := map[string]bool{}
	drop := func(node string) bool {
		if node == "" || masters[node] { // "": the cluster client itself, where the map had no answer
			return false
		}
		absent[node] = true
		return s.absent[node]
	}
	s.batch.forget(drop)
	s.breakers.forget(drop)
	s.absent = absent
}

// forgetLoop runs forgetGone every forgetEvery until the store closes.
func (s *Store) forgetLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.closed:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s.forgetGone(ctx)
		cancel()
	}
}

// get returns the breaker of node, made on first use.
func (nb *nodeBreakers) get(node string) *Breaker {
	nb.mu.Lock()
	defer nb.mu.Unlock()
	b, ok := nb.byNode[node]
	if !ok {
		b = NewBreaker(nb.threshold, nb.cooldown)
		nb.byNode[node] = b
	}
	return b
}

// admit asks the breakers of nodes whether calls may go to them at now.
// When one refuses, the probes that others granted are given back and
// admit returns a *NodeError wrapping ErrBreakerOpen.
func (nb *nodeBreakers) admit(nodes []string, now time.Time) error {
	for i, node := range nodes {
		if slices.Contains(nodes[:i], node) {
			continue
		}
		if !nb.get(node).Allow(now) {
			for _, granted := range nodes[:i] {
				nb.get(granted).CancelProbe()
			}
			return &NodeError{Node: node, Err: ErrBreakerOpen}
		}
	}
	return nil
}

// record takes the outcome of the calls to nodes into their breakers: a
// node fails when any of its calls found Redis unavailable, and succeeds
// otherwise (a script error is an answer). Without failures (releases,
// which are sent whatever the breaker says), only successes are recorded,
// so that a failed release neither delays a breaker's probe nor reopens it.
func (nb *nodeBreakers) record(nodes []string, errs []error, now time.Time, failures bool) {
	failed := map[string]bool{}
	for i, node := range nodes {
		failed[node] = failed[node] || Unavailable(errs[i])
	}
	for node, f := range failed {
		b := nb.get(node)
		switch {
		case f && failures && b.Failure(now):
			nb.notify(node, true)
		case !f && b.Success():
			nb.notify(node, false)
		}
	}
}

func (nb *nodeBreakers) notify(node string, open bool) {
	if nb.changed != nil {
		nb.changed(node, open)
	}
}

// anyOpen reports whether the breaker of one of nodes is open.
func (nb *nodeBreakers) anyOpen(nodes []string) bool {
	for _, node := range nodes {
		if nb.get(node).Open() {
			return true
		}
	}
	return false
}

// errNotSent marks a command that never left for Redis: its caller's time
// was up while it waited in its node's queue.
var errNotSent error = &bucket.NotRunError{Msg: "not sent: the decision's time was up in the queue"}

// route sets, for each run, the node it goes to and the client of that
// node: in a cluster, the master of the run's slot by go-redis's slot map
// (or the cluster client, which routes, when the map has no answer);
// outside, "" and the store's client.
func (s *Store) route(ctx context.Context, runs []scriptRun, nodes []string, clients []redis.Cmdable) {
	c, ok := s.client.(*redis.ClusterClient)
	for i, sr := range runs {
		clients[i] = s.client
		if !ok {
			continue
		}
		if n, err := c.MasterForKey(ctx, sr.keys[0]); err == nil {
			nodes[i], clients[i] = n.Options().Addr, n
		}
	}
}

// Node is the address of the Redis cluster master that holds req's state
// by the client's slot map: "" outside a cluster, or when the map has no
// answer yet.
func (s *Store) Node(ctx context.Context, req bucket.Request) string {
	return s.nodes(ctx, s.scriptRuns([]bucket.Request{req}))[0]
}

// nodes are the addresses of the cluster masters that runs go to (see
// route); outside a cluster, "" for each.
func (s *Store) nodes(ctx context.Context, runs []scriptRun) []string {
	nodes := make([]string, len(runs))
	s.route(ctx, runs, nodes, make([]redis.Cmdable, len(runs)))
	return nodes
}

// NodesOf are the nodes reqs go to ("" outside a cluster).
func (s *Store) NodesOf(ctx context.Context, reqs []bucket.Request) []string {
	return s.nodes(ctx, s.scriptRuns(reqs))
}
