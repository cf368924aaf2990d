package limiter

import (
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"time"
)

// memShards is the number of independently locked parts of a MemoryStore.
const memShards = 64

// DefaultSweepInterval is how often a MemoryStore drops idle buckets.
const DefaultSweepInterval = 30 * time.Second

// MemoryStore keeps buckets in this process: exact for one instance, and
// the store used when no Redis is configured. It is safe for concurrent
// use. Buckets back to their initial state (a token bucket full again)
// are dropped by a sweeper, so memory holds active clients only.
type MemoryStore struct {
	shards [memShards]memShard
	bans   memBans
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

type memShard struct {
	mu      sync.Mutex
	buckets map[bucketID]bucket
	peak    int // largest len(buckets) since the map was last rebuilt
	_       [40]byte
}

// NewMemoryStore returns a store whose sweeper runs every sweepEvery
// (DefaultSweepInterval when zero or negative) until Close.
func NewMemoryStore(sweepEvery time.Duration) *MemoryStore {
	if sweepEvery <= 0 {
		sweepEvery = DefaultSweepInterval
	}
	s := &MemoryStore{stop: make(chan struct{}), done: make(chan struct{})}
	s.bans.clients = make(map[bucketID]banState)
	for i := range s.shards {
		s.shards[i].buckets = make(map[bucketID]bucket)
	}
	go s.sweepLoop(sweepEvery)
	return s
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
	defer s.unlock(shards)
	s.takeLocked(now.UnixNano(), reqs, keys, decisions, before)
	for i := range decisions {
		decisions[i].At = now
	}
	return decisions
}

// savedBucket is a bucket as it was before a take, for its rollback.
type savedBucket struct {
	b     bucket
	known bool
}

// takeLocked applies each request in turn, into decisions, and rolls all
// of them back, in reverse order, from before, if one is refused; if none
// is, it names the concurrency slots taken after their requests. Costs are
// bounded (see boundedCost). All of it happens under the shards' locks: no
// other take comes between a charge and its rollback, which restores
// exactly the state before.
func (s *MemoryStore) takeLocked(now int64, reqs []Request, keys []bucketID, decisions []Decision, before []savedBucket) {
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
		return
	}
	for i := len(reqs) - 1; i >= 0; i-- {
		m := s.shard(keys[i]).buckets
		if before[i].known {
			m[keys[i]] = before[i].b
		} else {
			delete(m, keys[i])
		}
	}
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
// buckets it dropped.
func (s *MemoryStore) Sweep(now time.Time) int {
	s.sweepBans(now.UnixNano())
	dropped := 0
	for i := range s.shards {
		dropped += s.shards[i].sweep(now.UnixNano())
	}
	return dropped
}

func (sh *memShard) sweep(now int64) int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	before := len(sh.buckets)
	sh.peak = max(sh.peak, before)
	for k, b := range sh.buckets {
		if b.idleAt <= now {
			delete(sh.buckets, k)
		}
	}
	// Go maps never shrink: after a flood of keys, copy the survivors
	// into a new map so that the memory of the flood is released.
	if sh.peak > 1024 && len(sh.buckets) < sh.peak/4 {
		sh.buckets = shrink(sh.buckets)
		sh.peak = len(sh.buckets)
	}
	return before - len(sh.buckets)
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
