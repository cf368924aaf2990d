package limiter

import (
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// memShards is the number of independently locked parts of a MemoryStore.
const memShards = 64

// DefaultSweepInterval is how often a MemoryStore drops idle buckets.
const DefaultSweepInterval = 30 * time.Second

// DefaultMemoryCapacity is how many buckets a MemoryStore keeps unless
// SetCapacity says otherwise: at most about 120 MB of heap for token
// buckets (234 B each, maps included; TestMemoryFootprint), 125 MB for
// sliding logs of one request (250 B, plus 8 B per further request).
const DefaultMemoryCapacity = 500_000

// MinMemoryCapacity is the smallest capacity: a bucket per shard.
const MinMemoryCapacity = memShards

// evictSample is how many buckets of a full shard a new bucket looks at
// to choose the one it evicts (as Redis's approximated LRU samples 5).
const evictSample = 5

// MemoryStore keeps buckets in this process: exact for one instance, and
// the store used when no Redis is configured. It is safe for concurrent
// use. Buckets back to their initial state (a token bucket full again)
// are dropped by a sweeper, so memory holds active clients only. It keeps
// at most its capacity of buckets (see SetCapacity): a new bucket in a
// full store evicts another.
type MemoryStore struct {
	shards    [memShards]memShard
	bans      memBans
	evictions atomic.Uint64
	onEvict   atomic.Pointer[func(n int)]
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
}

type memShard struct {
	mu      sync.Mutex
	buckets map[bucketID]bucket
	peak    int // largest len(buckets) since the map was last rebuilt
	limit   int // the most buckets kept: the shard's part of the capacity
	_       [32]byte
}

// NewMemoryStore returns a store of DefaultMemoryCapacity whose sweeper
// runs every sweepEvery (DefaultSweepInterval when zero or negative)
// until Close.
func NewMemoryStore(sweepEvery time.Duration) *MemoryStore {
	if sweepEvery <= 0 {
		sweepEvery = DefaultSweepInterval
	}
	s := &MemoryStore{stop: make(chan struct{}), done: make(chan struct{})}
	s.bans.clients = make(map[bucketID]banState)
	for i := range s.shards {
		s.shards[i].buckets = make(map[bucketID]bucket)
	}
	s.SetCapacity(DefaultMemoryCapacity)
	go s.sweepLoop(sweepEvery)
	return s
}

// SetCapacity sets how many buckets s keeps, across zones: n, at least
// MinMemoryCapacity (0 or less: DefaultMemoryCapacity). Each shard keeps
// its part of n. When a new bucket finds its shard full, it evicts one of
// a few of the shard's buckets (evictSample): one that holds nothing back
// (full again, the same as a fresh bucket) if there is one, else the one
// that would be full again soonest. A store over a lowered capacity
// shrinks to it at its next sweep.
func (s *MemoryStore) SetCapacity(n int) {
	if n <= 0 {
		n = DefaultMemoryCapacity
	}
	n = max(n, MinMemoryCapacity)
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
func (s *MemoryStore) Capacity() int {
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
func (s *MemoryStore) Evictions() uint64 { return s.evictions.Load() }

// OnEvict has f told, outside the store's locks, of the buckets evicted
// by each call that evicted some (n of them); nil stops it. f must not
// block: it runs on the path of a decision.
func (s *MemoryStore) OnEvict(f func(n int)) {
	if f == nil {
		s.onEvict.Store(nil)
		return
	}
	s.onEvict.Store(&f)
}

// evicted counts n evictions and tells OnEvict's function of them.
func (s *MemoryStore) evicted(n int) {
	if n == 0 {
		return
	}
	s.evictions.Add(uint64(n))
	if f := s.onEvict.Load(); f != nil {
		(*f)(n)
	}
}

// Take is TakeAt with the current time; it never fails.
func (s *MemoryStore) Take(_ context.Context, reqs []Request) ([]Decision, error) {
	return s.TakeAt(time.Now(), reqs), nil
}

// TakeAt charges the buckets of reqs at time now, all or nothing (see
// Store.Take).
func (s *MemoryStore) TakeAt(now time.Time, reqs []Request) []Decision {
	// A few requests' keys, shards and saved buckets fit on the stack;
	// what is made is made before the locks are taken.
	var keyRoom [4]bucketID
	var shardRoom [4]int
	var savedRoom [4]savedBucket
	keys, before := keyRoom[:0], []savedBucket(nil)
	if len(reqs) <= len(savedRoom) {
		before = savedRoom[:len(reqs)]
	} else {
		before = make([]savedBucket, len(reqs))
	}
	for _, r := range reqs {
		keys = append(keys, bucketIDOf(r))
	}
	decisions := make([]Decision, len(reqs))
	shards := s.lock(keys, shardRoom[:0])
	s.evicted(s.takeUnlock(shards, now.UnixNano(), reqs, keys, decisions, before))
	for i := range decisions {
		decisions[i].At = now
	}
	return decisions
}

// takeUnlock is takeLocked, then unlocks shards, whatever happens.
func (s *MemoryStore) takeUnlock(shards []int, now int64, reqs []Request, keys []bucketID, decisions []Decision, before []savedBucket) int {
	defer s.unlock(shards)
	return s.takeLocked(now, reqs, keys, decisions, before)
}

// savedBucket is a bucket as it was before a take, for its rollback.
type savedBucket struct {
	b     bucket
	known bool
}

// takeLocked applies each request in turn, into decisions, and rolls all
// of them back, in reverse order, from before, if one is refused; if none
// is, it names the concurrency slots taken after their requests, and
// makes room for the buckets it added (see makeRoom), returning how many
// it evicted. Costs are bounded (see boundedCost). All of it happens under
// the shards' locks: no other take comes between a charge and its
// rollback, which restores exactly the state before (a refused take adds
// no bucket, so it evicts none).
func (s *MemoryStore) takeLocked(now int64, reqs []Request, keys []bucketID, decisions []Decision, before []savedBucket) int {
	allowed := true
	for i, r := range reqs {
		m := s.shard(keys[i]).buckets
		b, known := m[keys[i]]
		before[i] = savedBucket{b, known}
		m[keys[i]], decisions[i] = r.Policy.take(b, known, now, boundedCost(r.Cost))
		allowed = allowed && decisions[i].Allowed
	}
	if allowed {
		s.holdSlots(reqs, keys)
		return s.makeRoom(now, keys, before)
	}
	for i := len(reqs) - 1; i >= 0; i-- {
		m := s.shard(keys[i]).buckets
		if before[i].known {
			m[keys[i]] = before[i].b
		} else {
			delete(m, keys[i])
		}
	}
	return 0
}

// makeRoom evicts, for each bucket of keys that the take added (unknown
// before) to a shard now over its limit, a bucket of that shard other
// than the take's own (see evictOne); two while the shard is still over
// it (its capacity was lowered), so that it comes back to it. It returns
// how many buckets it evicted. Under the shards' locks.
func (s *MemoryStore) makeRoom(now int64, keys []bucketID, before []savedBucket) int {
	evicted := 0
	for i := range keys {
		if before[i].known {
			continue
		}
		sh := s.shard(keys[i])
		for range 2 {
			if len(sh.buckets) <= sh.limit || !sh.evictOne(now, keys, keys[i].zone) {
				break
			}
			evicted++
		}
	}
	return evicted
}

// evictOne drops, of up to evictSample buckets of sh other than those of
// keep, met from a random place in the map, the first idle one (it holds
// nothing back: a missing bucket stands for it), else one of zone, the
// zone that adds a bucket, that would be idle soonest (the least held
// back), else such a one of another zone, and reports whether there was
// one: a flood of new keys in one zone evicts its own buckets before
// another zone's clients. A concurrency bucket, idle only once its slots
// are released, goes last. Under sh's lock.
func (sh *memShard) evictOne(now int64, keep []bucketID, zone string) bool {
	var victim bucketID
	least, seen, victimOther := int64(0), 0, true
	for k, b := range sh.buckets {
		if slices.Contains(keep, k) {
			continue
		}
		other := k.zone != zone && b.idleAt > now // an idle bucket of any zone goes first
		if seen == 0 || !other && victimOther || other == victimOther && b.idleAt < least {
			victim, least, victimOther = k, b.idleAt, other
		}
		if seen++; seen == evictSample || least <= now {
			break
		}
	}
	if seen == 0 {
		return false
	}
	delete(sh.buckets, victim)
	return true
}

// holdSlots names the concurrency slots that reqs took after their
// requests (see bucket.hold).
func (s *MemoryStore) holdSlots(reqs []Request, keys []bucketID) {
	for i, r := range reqs {
		if r.Policy.Algorithm == Concurrency {
			m := s.shard(keys[i]).buckets
			m[keys[i]] = m[keys[i]].hold(r.ID, boundedCost(r.Cost))
		}
	}
}

// Release gives back the concurrency slots of reqs (see Store.Release):
// each request's own slot, named by its ID, if its bucket holds it. A slot
// taken before a Reset frees none taken after it.
func (s *MemoryStore) Release(_ context.Context, reqs []Request) error {
	now := time.Now().UnixNano()
	for _, r := range reqs {
		if r.Policy.Algorithm != Concurrency {
			continue
		}
		k := bucketIDOf(r)
		sh := s.shard(k)
		sh.mu.Lock()
		if b, ok := sh.buckets[k]; ok {
			sh.buckets[k] = r.Policy.release(b, now, r.ID)
		}
		sh.mu.Unlock()
	}
	return nil
}

// Peek tells the state of req's bucket (see Store.Peek).
func (s *MemoryStore) Peek(_ context.Context, req Request) (Decision, error) {
	k := bucketIDOf(req)
	sh := s.shard(k)
	sh.mu.Lock()
	b, known := sh.buckets[k]
	sh.mu.Unlock()
	_, d := req.Policy.take(b, known, time.Now().UnixNano(), 0)
	return d, nil
}

// Reset drops req's bucket (see Store.Reset).
func (s *MemoryStore) Reset(_ context.Context, req Request) error {
	k := bucketIDOf(req)
	sh := s.shard(k)
	sh.mu.Lock()
	delete(sh.buckets, k)
	sh.mu.Unlock()
	s.bans.mu.Lock()
	delete(s.bans.clients, bucketIDOf(req))
	s.bans.mu.Unlock()
	return nil
}

func (s *MemoryStore) shardIndex(k bucketID) int {
	return int(binary.LittleEndian.Uint64(k.hash[:8]) % memShards)
}

func (s *MemoryStore) shard(k bucketID) *memShard {
	return &s.shards[s.shardIndex(k)]
}

// lock locks the shards of keys in ascending order (so that concurrent
// multi-key calls cannot deadlock) and returns them for unlock, listed
// in idx's room.
func (s *MemoryStore) lock(keys []bucketID, idx []int) []int {
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

func (s *MemoryStore) unlock(idx []int) {
	for _, i := range idx {
		s.shards[i].mu.Unlock()
	}
}

// Len is the number of buckets held.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.buckets)
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops the buckets idle at now (back to their initial state, which
// a missing bucket stands for), and the expired bans, and returns how many
// buckets it dropped. A shard then over its limit (the capacity was
// lowered) is trimmed to it, its least held back buckets evicted; they
// count among the buckets dropped.
func (s *MemoryStore) Sweep(now time.Time) int {
	s.sweepBans(now.UnixNano())
	dropped, evicted := 0, 0
	for i := range s.shards {
		d, e := s.shards[i].sweep(now.UnixNano())
		dropped, evicted = dropped+d, evicted+e
	}
	s.evicted(evicted)
	return dropped
}

// sweep drops sh's idle buckets and trims it to its limit; it returns how
// many buckets it dropped, and how many of them it evicted to trim it.
func (sh *memShard) sweep(now int64) (dropped, evicted int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	before := len(sh.buckets)
	sh.peak = max(sh.peak, before)
	for k, b := range sh.buckets {
		if b.idleAt <= now {
			delete(sh.buckets, k)
		}
	}
	evicted = sh.trim()
	// Go maps never shrink: after a flood of keys, copy the survivors
	// into a new map so that the memory of the flood is released.
	if sh.peak > 1024 && len(sh.buckets) < sh.peak/4 {
		sh.buckets = shrink(sh.buckets)
		sh.peak = len(sh.buckets)
	}
	return before - len(sh.buckets), evicted
}

// trim evicts the least held back buckets of sh (the soonest idle) until
// it holds no more than its limit, and returns how many it evicted. It
// sorts the times of all of them: it runs in the sweep, which goes over
// them all anyway, and only once the capacity was lowered (or charges
// after a response brought back evicted buckets). Under sh's lock.
func (sh *memShard) trim() int {
	over := len(sh.buckets) - sh.limit
	if over <= 0 {
		return 0
	}
	times := make([]int64, 0, len(sh.buckets))
	for _, b := range sh.buckets {
		times = append(times, b.idleAt)
	}
	slices.Sort(times)
	// Evict those idle before last, and enough of those idle at last.
	last := times[over-1]
	before, _ := slices.BinarySearch(times, last)
	atLast := over - before
	for k, b := range sh.buckets {
		switch {
		case b.idleAt < last:
			delete(sh.buckets, k)
		case b.idleAt == last && atLast > 0:
			delete(sh.buckets, k)
			atLast--
		}
	}
	return over
}

// shrink copies m into a map sized for its contents (maps.Clone would keep
// the old capacity).
func shrink(m map[bucketID]bucket) map[bucketID]bucket {
	n := make(map[bucketID]bucket, len(m))
	for k, v := range m {
		n[k] = v
	}
	return n
}

func (s *MemoryStore) sweepLoop(every time.Duration) {
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
func (s *MemoryStore) Close() error {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// Interface guard.
var _ Store = (*MemoryStore)(nil)

// Memory is l's memory store: the store that decides without Redis, and
// with it, on_store_error local's (see fallBack).
func (l *Limiter) Memory() *MemoryStore { return l.memory }
