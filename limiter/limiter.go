package limiter

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// Limiter decides the zones of HTTP requests against one store: this
// process's memory, or Redis with its circuit breakers (one per node), a
// cache of the clients Redis refused (refused here without a round trip
// until they could pass), the bans of repeat offenders, and this process's
// memory to fall back on when Redis fails. It is the one thing a handler
// asks: Decide gives a Verdict, with a State per zone; Settle, Peek and
// Reset do the rest.
//
// A Verdict is all or nothing: when one zone refuses, no zone is charged.
// Dry-run requests (Request.DryRun) are decided apart, charged as any, and
// never refuse: their State is WouldRefuse instead.
//
// Time is a parameter: the clock of memory decisions, of the cache of
// refused clients and of bans; Redis decides on its server's clock. Safe for
// concurrent use; one Limiter serves every handler that shares its store.
type Limiter struct {
	redis   *redisstore.Store       // nil: the memory store decides
	sync    *fleetsync.Syncer       // the zones that sync; nil with memory alone
	fleet   *fleetsync.StorageFleet // the storage the zones that sync share; nil but for NewStorageLimiter
	regions *regions.Exchange       // the global zones' exchange with the other regions; nil without regions
	memory  *memstore.Store
	refused *DenyCache      // clients Redis refused; nil without Redis
	retries *releaseRetries // releases of slots to try again; nil without Redis
	timeout time.Duration   // the longest a store call waits

	// failing are the Redis nodes whose failure was reported and not yet
	// their recovery ("" outside a cluster, or for a failure of no known
	// node), and nFailing how many.
	failing           sync.Map
	nFailing          atomic.Int32
	scriptErrorLogged atomic.Int64 // when a failed script was last reported loudly (Unix ns)
}

// Caller is who asks a Decide: what its requests fall back on when the
// store fails, and where the events of its decisions go.
type Caller struct {
	Fallback Fallback
	Events   Events
}

// Events are told what a decision does that its Verdict does not say: the
// store's failures and recoveries, the bans started, and what needs no
// action. Their methods must not block; they may be called after Decide
// returns (a release of slots that failed).
type Events interface {
	// StoreFailing: a Redis node began to fail (err names it, in a
	// cluster); the fallback decides its requests until it answers again.
	// Called once per node's failure, whichever caller sees it.
	StoreFailing(err error)
	// StoreRecovered: node ("" outside a cluster) answered again after its
	// StoreFailing.
	StoreRecovered(node string)
	// ScriptFailed: a script failed in a Redis that answered; loud is true
	// at most once per ScriptErrorReportEvery.
	ScriptFailed(err error, loud bool)
	// BanStarted: a refusal in zone banned its client for left.
	BanStarted(zone string, left time.Duration)
	// Debug reports something that needs no action.
	Debug(msg string, err error)
}

// NodeEvents are told of the Redis nodes: their breakers, and the cluster
// nodes that no longer serve slots. Their methods must not block.
type NodeEvents interface {
	// BreakerChanged: the breaker of node ("" outside a cluster) opened or
	// closed.
	BreakerChanged(node string, open bool)
	// NodeGone: a cluster node no longer serves slots.
	NodeGone(node string)
}

// ScriptErrorReportEvery throttles the loud reports of failed scripts: a
// client may cause them at will.
const ScriptErrorReportEvery = 10 * time.Second

// RedisOptions configure NewRedisLimiter.
type RedisOptions struct {
	// KeyPrefix starts every key; DefaultKeyPrefix when empty.
	KeyPrefix string
	// Timeout is the longest a call waits on Redis (a decision, a ban, a
	// settlement, a release); releases tried again wait at least a second.
	// Default: 1s.
	Timeout time.Duration
	// LocalCache is how many refused clients are remembered; 0: none.
	LocalCache int
	// LocalCacheMaxAge is the longest a refusal is remembered, so that a
	// reset through another instance reaches this one.
	LocalCacheMaxAge time.Duration
}

// NewMemoryLimiter returns a Limiter that decides in this process's
// memory.
func NewMemoryLimiter() *Limiter {
	return &Limiter{memory: memstore.New(0), timeout: time.Second}
}

// NewRedisLimiter returns a Limiter that decides in the Redis of client,
// which Close closes; nodes are told of its nodes' breakers.
func NewRedisLimiter(client redisstore.Client, o RedisOptions, nodes NodeEvents) (*Limiter, error) {
	store, err := redisstore.New(client, o.KeyPrefix)
	if err != nil {
		return nil, err
	}
	l := &Limiter{redis: store, memory: memstore.New(0), timeout: cmp.Or(o.Timeout, time.Second),
		refused: NewDenyCache(o.LocalCache, o.LocalCacheMaxAge)}
	l.retries = newReleaseRetries(store, max(l.timeout, time.Second))
	l.sync = fleetsync.NewSyncer(store, l.memory, max(l.timeout, time.Second))
	store.OnBreaker(nodes.BreakerChanged)
	store.OnForget(func(node string) {
		if _, was := l.failing.LoadAndDelete(node); was { // no request will tell its recovery
			l.nFailing.Add(-1)
		}
		nodes.NodeGone(node)
	})
	return l, nil
}

// NewStorageLimiter returns a Limiter whose zones that sync share their
// counts with the instances that write to st (see fleetsync.StorageFleet); the
// others decide in this process's memory. It reads the others' counts and
// writes its own before it returns (each within o.Timeout).
func NewStorageLimiter(st fleetsync.Storage, o fleetsync.StorageOptions) *Limiter {
	f := fleetsync.NewStorageFleet(st, o)
	l := &Limiter{memory: memstore.New(0), timeout: time.Second, fleet: f}
	l.sync = fleetsync.NewSyncer(f, l.memory, l.timeout)
	f.Start()
	return l
}

// Close stops the Limiter's background work and closes its stores.
func (l *Limiter) Close() error {
	if l.regions != nil {
		l.regions.Close()
	}
	if l.retries != nil {
		l.retries.stop()
	}
	if l.sync != nil {
		l.sync.Close()
	}
	if l.fleet != nil {
		l.fleet.Close() // after the Syncer's last round: its last write has it all
	}
	err := l.memory.Close()
	if l.redis != nil {
		err = errors.Join(err, l.redis.Close())
	}
	return err
}

// Ping tells whether the store answers.
func (l *Limiter) Ping(ctx context.Context) error {
	if l.redis == nil {
		return nil
	}
	return l.redis.Ping(ctx)
}

// store is the store that decides: Redis, or else memory.
func (l *Limiter) store() Store {
	if l.redis != nil {
		return l.redis
	}
	return l.memory
}

// Peek tells the state of req's bucket without changing it.
func (l *Limiter) Peek(ctx context.Context, req Request) (Decision, error) {
	req = l.regional(req)
	if l.fleet != nil && req.Sync > 0 { // the fleet's counts as this instance last read them
		req.Cost, req.ID = 0, ""
		d, err := l.fleet.ChargeAll(ctx, []Request{req})
		if err != nil {
			return Decision{}, err
		}
		return d[0], nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	return l.store().Peek(ctx, req)
}

// Reset drops req's bucket and its client's ban, and forgets the client
// in this process's cache of refused clients; other processes forget it
// within their cache's MaxAge.
func (l *Limiter) Reset(ctx context.Context, req Request) error {
	if l.refused != nil {
		l.refused.Delete(req)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	return l.store().Reset(ctx, req)
}

// Settle brings the charges of allowed requests to what their responses
// say, within one timeout: refund gives back, now, what of each request's
// Cost its take's charge still holds back, taken[i] being the decision of
// refund[i]'s take; charge charges each its Cost now, into debt if need be
// (see Store.Refund and Store.Charge). refunded and charged tell the
// buckets after, in the order of refund and charge; a request the store
// did not answer has a zero Decision.
func (l *Limiter) Settle(refund []Request, taken []Decision, charge []Request) (refunded, charged []Decision, refundErr, chargeErr error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	if len(refund) > 0 {
		refunded, refundErr = l.store().Refund(ctx, refund, taken)
	}
	if len(charge) > 0 {
		charged, chargeErr = l.store().Charge(ctx, charge)
	}
	return refunded, charged, refundErr, chargeErr
}

// StoreKind names the kind of store a Limiter decides with, as metrics and
// logs label it.
type StoreKind string

// The kinds of store.
const (
	StoreMemory  StoreKind = "memory"  // this process's memory
	StoreRedis   StoreKind = "redis"   // Redis (its on_store_error local in memory)
	StoreStorage StoreKind = "storage" // zones that sync through a storage; the others in memory
)

// Kind names the store that decides: StoreRedis, StoreStorage or
// StoreMemory.
func (l *Limiter) Kind() StoreKind {
	switch {
	case l.redis != nil:
		return StoreRedis
	case l.fleet != nil:
		return StoreStorage
	}
	return StoreMemory
}

// Breaker is the circuit breaker of a Redis node ("" outside a cluster);
// nil without Redis.
func (l *Limiter) Breaker(node string) *redisstore.Breaker {
	if l.redis == nil {
		return nil
	}
	return l.redis.Breaker(node)
}

// Node is the address of the Redis node that holds req's bucket ("" outside
// a cluster, or without Redis).
func (l *Limiter) Node(ctx context.Context, req Request) string {
	if l.redis == nil {
		return ""
	}
	return l.redis.Node(ctx, req)
}

// Memory is l's memory store: the store that decides without Redis, and
// with it, on_store_error local's (see fallBack).
func (l *Limiter) Memory() *memstore.Store { return l.memory }
