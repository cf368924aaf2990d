package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/errs"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
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
	redis     *redisstore.Store       // nil: the memory store decides
	sync      *fleetsync.Syncer       // the zones that sync; nil with memory alone
	fleet     *fleetsync.StorageFleet // the storage the zones that sync share; nil but with Config.Storage
	regions   *regions.Exchange       // the global zones' exchange with the other regions; nil without regions
	peers     []*redisstore.Store     // the peer regions' Redis, which regions speaks to
	overrides *overrides.Overrides    // the run-time overrides, kept where the buckets are
	memory    *memstore.Store
	refused   *RefusedCache   // clients Redis refused; nil without Redis
	retries   *releaseRetries // releases of slots to try again; nil without Redis
	timeout   time.Duration   // the longest a store call waits

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
	counted  int64 // the regions counted for its global zones' policies (decideGlobal), 0 without
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

// Close stops the Limiter's background work and closes its stores.
func (l *Limiter) Close() error {
	if l.overrides != nil {
		l.overrides.Close()
	}
	if l.regions != nil {
		l.regions.Close() // a last exchange with the peers
	}
	for _, p := range l.peers {
		_ = p.Close()
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
		err = errs.Join(err, l.redis.Close())
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
func (l *Limiter) Breaker(node string) *Breaker {
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

// Overrides are the run-time overrides of the zones, kept where the
// buckets are: in Redis, or in this process's memory.
func (l *Limiter) Overrides() *overrides.Overrides { return l.overrides }

// SetMemoryCapacity sets how many buckets the memory store keeps: the
// store without Redis, and with it on_store_error local's.
func (l *Limiter) SetMemoryCapacity(n int) { l.memory.SetCapacity(n) }

// OnEvict sets f to be told of the n buckets the memory store evicts,
// being full.
func (l *Limiter) OnEvict(f func(n int)) { l.memory.OnEvict(f) }

// MemoryStats are figures of the memory store.
type MemoryStats struct {
	Buckets, Capacity int
	Evictions         uint64
}

// MemoryStats tells the memory store's buckets, capacity and evictions.
func (l *Limiter) MemoryStats() MemoryStats {
	return MemoryStats{Buckets: l.memory.Len(), Capacity: l.memory.Capacity(), Evictions: l.memory.Evictions()}
}
