package memstore

import (
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// memShards is the number of independently locked parts of a Store.
const memShards = 64

// DefaultSweepInterval is how often a Store drops idle buckets.
const DefaultSweepInterval = 30 * time.Second

// DefaultCapacity is how many buckets a Store keeps unless
// SetCapacity says otherwise: at most about 92 MB of heap for token
// buckets (184 B each, maps included; TestMemoryFootprint), 100 MB for
// sliding logs of one request (200 B, plus 8 B per further request).
const DefaultCapacity = 500_000

// MinCapacity is the smallest capacity: a bucket per shard.
const MinCapacity = memShards

// Store keeps buckets in this process: exact for one instance, and
// the store used when no Redis is configured. It is safe for concurrent
// use. Buckets back to their initial state (a token bucket full again)
// are dropped by a sweeper, so memory holds active clients only. It keeps
// at most its capacity of buckets (see SetCapacity): a new bucket in a
// full store evicts another.
//
// Each of its shards keeps its buckets in groups, one per zone (and
// algorithm), so that eviction keeps this invariant: a new bucket of zone
// Z in a full shard evicts a bucket of another zone that still holds back
// tokens only when the shard holds no bucket of Z to give (besides the
// take's own); so, whatever the mix in the store, a flood of new keys in
// Z evicts Z's buckets, and idle ones of any zone, before another zone's
// clients, and a drained bucket of another zone goes never before a full
// one of Z. A flood in a zone new to a full shard takes the place of one
// bucket there, of the zone that holds the most. See evictOne;
// TestMemoryFloodKeepsOtherZones holds it.
type Store struct {
	shards    [memShards]memShard
	bans      memBans
	evictions atomic.Uint64
	onEvict   atomic.Pointer[func(n int)]
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
}

type memShard struct {
	mu     sync.Mutex
	groups map[zoneAlgo]*memGroup
	n      int // the buckets held, in all groups
	limit  int // the most buckets kept: the shard's part of the capacity
	_      [32]byte
}

// New returns a store of DefaultCapacity whose sweeper
// runs every sweepEvery (DefaultSweepInterval when zero or negative)
// until Close.
func New(sweepEvery time.Duration) *Store {
	if sweepEvery <= 0 {
		sweepEvery = DefaultSweepInterval
	}
	s := &Store{stop: make(chan struct{}), done: make(chan struct{})}
	s.bans.clients = make(map[bucket.ID]banState)
	for i := range s.shards {
		s.shards[i].groups = make(map[zoneAlgo]*memGroup)
	}
	s.SetCapacity(DefaultCapacity)
	go s.sweepLoop(sweepEvery)
	return s
}

// SetCapacity sets how many buckets s keeps, across zones: n, at least
// MinCapacity (0 or less: DefaultCapacity). Each shard keeps
// its part of n. When a new bucket finds its shard full, it evicts
// another (see evictOne): one that holds nothing back (full again, the
// same as a fresh bucket), else one of its own zone. A store over a
// lowered capacity shrinks to it at its next sweep.
func (s *Store) SetCapacity(n int) {
	if n <= 0 {
		n = DefaultCapacity
	}
	n = max(n, MinCapacity)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.limit = n / memShards
		if i < n%memShards {
			sh.limit++
		}
		sh.mu.Unlock()
	}
}

// Capacity is how many buckets s keeps at most (see SetCapacity).
func (s *Store) Capacity() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.limit
		sh.mu.Unlock()
	}
	return n
}

// Evictions is how many buckets s has evicted to stay within its
// capacity.
func (s *Store) Evictions() uint64 { return s.evictions.Load() }

// OnEvict has f told, outside the store's locks, of the buckets evicted
// by each call that evicted some (n of them); nil stops it. f must not
// block: it runs on the path of a decision.
func (s *Store) OnEvict(f func(n int)) {
	if f == nil {
		s.onEvict.Store(nil)
		return
	}
	s.onEvict.Store(&f)
}

// evicted counts n evictions and tells OnEvict's function of them.
func (s *Store) evicted(n int) {
	if n == 0 {
		return
	}
	s.evictions.Add(uint64(n))
	if f := s.onEvict.Load(); f != nil {
		(*f)(n)
	}
}

// Take is TakeAt with the current time; it never fails.
func (s *Store) Take(_ context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	return s.TakeAt(time.Now(), reqs), nil
}

// TakeAt charges the buckets of reqs at time now, all or nothing (see
// Store.Take).
func (s *Store) TakeAt(now time.Time, reqs []bucket.Request) []bucket.Decision {
	return s.TakeInto(now, reqs, nil)
}

// TakeInto is TakeAt writing the decisions into dst when it has room for
// them (they are dst[:len(reqs)]), into a new slice when not.
func (s *Store) TakeInto(now time.Time, reqs []bucket.Request, dst []bucket.Decision) []bucket.Decision {
	// A few requests' keys, shards and saved buckets fit on the stack;
	// what is made is made before the locks are taken.
	var keyRoom [4]bucket.ID
	var shardRoom [4]int
	var savedRoom [4]savedBucket
	keys, before := keyRoom[:0], []savedBucket(nil)
	if len(reqs) <= len(savedRoom) {
		before = savedRoom[:len(reqs)]
	} else {
		before = make([]savedBucket, len(reqs))
	}
	for _, r := range reqs {
		keys = append(keys, bucket.IDOf(r))
	}
	var decisions []bucket.Decision
	if dst != nil && cap(dst) >= len(reqs) {
		decisions = dst[:len(reqs)]
		clear(decisions)
	} else {
		decisions = make([]bucket.Decision, len(reqs))
	}
	shards := s.lock(keys, shardRoom[:0])
	s.evicted(s.takeUnlock(shards, now.UnixNano(), reqs, keys, decisions, before))
	for i := range decisions {
		decisions[i].At = now
	}
	return decisions
}

// takeUnlock is takeLocked, then unlocks shards, whatever happens.
func (s *Store) takeUnlock(shards []int, now int64, reqs []bucket.Request, keys []bucket.ID, decisions []bucket.Decision, before []savedBucket) int {
	defer s.unlock(shards)
	return s.takeLocked(now, reqs, keys, decisions, before)
}

// savedBucket is a bucket as it was before a take, for its rollback.
type savedBucket struct {
	b     bucket.State
	known bool
}

// takeLocked applies each request in turn, into decisions, and rolls all
// of them back, in reverse order, from before, if one is refused; if none
// is, it names the concurrency slots taken after their requests, and
// makes room for the buckets it added (see makeRoom), returning how many
// it evicted. Costs are bounded (see bucket.BoundedCost). All of it
// happens under the shards' locks: no other take comes between a charge
// and its rollback, which restores exactly the state before (a refused
// take adds no bucket, so it evicts none).
func (s *Store) takeLocked(now int64, reqs []bucket.Request, keys []bucket.ID, decisions []bucket.Decision, before []savedBucket) int {
	allowed := true
	for i, r := range reqs {
		sh := s.shard(keys[i])
		g := sh.group(keys[i])
		b, known := g.buckets[keys[i].Hash]
		before[i] = savedBucket{b, known}
		g.buckets[keys[i].Hash], decisions[i] = r.Policy.Take(b, known, now, bucket.BoundedCost(r.Cost))
		if !known {
			sh.n++
		}
		allowed = allowed && decisions[i].Allowed
	}
	if allowed {
		s.holdSlots(reqs, keys)
		return s.makeRoom(now, keys, before)
	}
	for i := len(reqs) - 1; i >= 0; i-- {
		sh := s.shard(keys[i])
		if before[i].known {
			sh.put(keys[i], before[i].b)
		} else {
			sh.drop(keys[i])
		}
	}
	return 0
}

// holdSlots names the concurrency slots that reqs took after their
// requests (see bucket.hold).
func (s *Store) holdSlots(reqs []bucket.Request, keys []bucket.ID) {
	for i, r := range reqs {
		if r.Policy.Algorithm == bucket.Concurrency {
			sh := s.shard(keys[i])
			b, _ := sh.get(keys[i])
			sh.put(keys[i], b.Hold(r.ID, bucket.BoundedCost(r.Cost)))
		}
	}
}

// Release gives back the concurrency slots of reqs (see Store.Release):
// each request's own slot, named by its ID, if its bucket holds it. A slot
// taken before a Reset frees none taken after it.
func (s *Store) Release(_ context.Context, reqs []bucket.Request) error {
	now := time.Now().UnixNano()
	for _, r := range reqs {
		if r.Policy.Algorithm != bucket.Concurrency {
			continue
		}
		k := bucket.IDOf(r)
		sh := s.shard(k)
		sh.mu.Lock()
		if b, ok := sh.get(k); ok {
			sh.put(k, r.Policy.Release(b, now, r.ID))
		}
		sh.mu.Unlock()
	}
	return nil
}

// Peek tells the state of req's bucket (see Store.Peek).
func (s *Store) Peek(_ context.Context, req bucket.Request) (bucket.Decision, error) {
	k := bucket.IDOf(req)
	sh := s.shard(k)
	sh.mu.Lock()
	b, known := sh.get(k)
	sh.mu.Unlock()
	_, d := req.Policy.Take(b, known, time.Now().UnixNano(), 0)
	return d, nil
}

// Reset drops req's bucket (see Store.Reset).
func (s *Store) Reset(_ context.Context, req bucket.Request) error {
	k := bucket.IDOf(req)
	sh := s.shard(k)
	sh.mu.Lock()
	sh.drop(k)
	sh.mu.Unlock()
	s.bans.mu.Lock()
	delete(s.bans.clients, bucket.IDOf(req))
	s.bans.mu.Unlock()
	return nil
}

func (s *Store) shardIndex(k bucket.ID) int {
	return int(binary.LittleEndian.Uint64(k.Hash[:8]) % memShards)
}

func (s *Store) shard(k bucket.ID) *memShard {
	return &s.shards[s.shardIndex(k)]
}

// lock locks the shards of keys in ascending order (so that concurrent
// multi-key calls cannot deadlock) and returns them for unlock, listed
// in idx's room.
func (s *Store) lock(keys []bucket.ID, idx []int) []int {
	for _, k := range keys {
		idx = append(idx, s.shardIndex(k))
	}
	if len(idx) > 1 {
		slices.Sort(idx)
		idx = slices.Compact(idx)
	}
	for _, i := range idx {
		s.shards[i].mu.Lock()
	}
	return idx
}

func (s *Store) unlock(idx []int) {
	for _, i := range idx {
		s.shards[i].mu.Unlock()
	}
}

// Len is the number of buckets held.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops the buckets idle at now (back to their initial state, which
// a missing bucket stands for), and the expired bans, and returns how many
// buckets it dropped. A shard then over its limit (the capacity was
// lowered) is trimmed to it, its least held back buckets evicted; they
// count among the buckets dropped.
func (s *Store) Sweep(now time.Time) int {
	s.sweepBans(now.UnixNano())
	dropped, evicted := 0, 0
	for i := range s.shards {
		d, e := s.shards[i].sweep(now.UnixNano())
		dropped, evicted = dropped+d, evicted+e
	}
	s.evicted(evicted)
	return dropped
}

func (s *Store) sweepLoop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.Sweep(now)
		}
	}
}

// Close stops the sweeper and waits for it to end. It is safe to call
// more than once.
func (s *Store) Close() error {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	return nil
}
