package memstore

import (
	"math"
	"slices"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// evictSample is how many buckets of a group a new bucket looks at to
// choose the one it evicts (as Redis's approximated LRU samples 5).
const evictSample = 5

// zoneAlgo names a group of a shard: the buckets of one zone and
// algorithm (a zone has one algorithm; a reload may change it).
type zoneAlgo struct {
	zone string
	algo bucket.Algorithm
}

func zoneAlgoOf(k bucket.ID) zoneAlgo { return zoneAlgo{k.Zone, k.Algo} }

// memGroup is the buckets of one zone and algorithm in a shard, by the
// digest of their key.
type memGroup struct {
	buckets map[[16]byte]bucket.State
	peak    int // largest len(buckets) since the map was last rebuilt
}

// group is sh's group of k's zone and algorithm, made when missing (an
// empty group is dropped at the next sweep). Under sh's lock.
func (sh *memShard) group(k bucket.ID) *memGroup {
	za := zoneAlgoOf(k)
	g := sh.groups[za]
	if g == nil {
		g = &memGroup{buckets: make(map[[16]byte]bucket.State)}
		sh.groups[za] = g
	}
	return g
}

// get is k's bucket, and whether sh holds it. Under sh's lock.
func (sh *memShard) get(k bucket.ID) (bucket.State, bool) {
	g := sh.groups[zoneAlgoOf(k)]
	if g == nil {
		return bucket.State{}, false
	}
	b, ok := g.buckets[k.Hash]
	return b, ok
}

// put stores b as k's bucket. Under sh's lock.
func (sh *memShard) put(k bucket.ID, b bucket.State) {
	g := sh.group(k)
	n := len(g.buckets)
	g.buckets[k.Hash] = b
	sh.n += len(g.buckets) - n
}

// drop deletes k's bucket, if sh holds it. Under sh's lock.
func (sh *memShard) drop(k bucket.ID) {
	if g := sh.groups[zoneAlgoOf(k)]; g != nil {
		n := len(g.buckets)
		delete(g.buckets, k.Hash)
		sh.n -= n - len(g.buckets)
	}
}

// makeRoom evicts, for each bucket of keys that the take added (unknown
// before) to a shard now over its limit, a bucket of that shard other
// than the take's own (see evictOne); two while the shard is still over
// it (its capacity was lowered), so that it comes back to it. It returns
// how many buckets it evicted. Under the shards' locks.
func (s *Store) makeRoom(now int64, keys []bucket.ID, before []savedBucket) int {
	evicted := 0
	for i := range keys {
		if before[i].known {
			continue
		}
		sh := s.shard(keys[i])
		for range 2 {
			if sh.n <= sh.limit || !sh.evictOne(now, keys, keys[i]) {
				break
			}
			evicted++
		}
	}
	return evicted
}

// evictOne drops a bucket of sh, other than those of keep, to make room
// for added, and reports whether there was one. Of up to evictSample
// buckets sampled in each group (see pick), it drops, in this order:
//
//  1. an idle bucket of added's group (it holds nothing back: a missing
//     bucket stands for it);
//  2. an idle bucket of another group;
//  3. the bucket of added's group that would be idle soonest (the least
//     held back);
//  4. only when added's group has none to give: the one that would be
//     idle soonest of the group that holds the most buckets.
//
// So a bucket of another zone that holds back tokens goes only while the
// shard holds no bucket of added's zone: a flood of new keys in one zone
// evicts its own buckets before another zone's clients. A concurrency
// bucket holding slots (idle at the maximum) goes last in its group.
// Under sh's lock.
func (sh *memShard) evictOne(now int64, keep []bucket.ID, added bucket.ID) bool {
	own := zoneAlgoOf(added)
	victim, at, ok := sh.groups[own].pick(now, own, keep)
	if ok && at <= now {
		return sh.evict(own, victim)
	}
	var big candidate
	for za, g := range sh.groups {
		if za == own {
			continue
		}
		k, t, found := g.pick(now, za, keep)
		if found && t <= now {
			return sh.evict(za, k)
		}
		if found {
			big = big.larger(candidate{za, k, t, len(g.buckets)})
		}
	}
	switch {
	case ok && (at != math.MaxInt64 || big.size == 0 || big.at == math.MaxInt64):
		return sh.evict(own, victim)
	case big.size > 0:
		return sh.evict(big.za, big.h)
	}
	return false
}

// candidate is a bucket evictOne may evict: the one a group's pick chose
// (idle at at), and the size of its group (0: none).
type candidate struct {
	za   zoneAlgo
	h    [16]byte
	at   int64
	size int
}

// larger is the candidate of the larger group of c and o, one that does
// not hold concurrency slots first.
func (c candidate) larger(o candidate) candidate {
	cSlots, oSlots := c.at == math.MaxInt64, o.at == math.MaxInt64
	if c.size == 0 || cSlots && !oSlots || cSlots == oSlots && o.size > c.size {
		return o
	}
	return c
}

// evict drops the bucket of digest h in sh's group za; it reports true.
// Under sh's lock.
func (sh *memShard) evict(za zoneAlgo, h [16]byte) bool {
	delete(sh.groups[za].buckets, h)
	sh.n--
	return true
}

// pick samples up to evictSample buckets of g (the group za), met from a
// random place in its map, leaving out those of keep, and returns the
// first one idle at now, else the one idle soonest, with its idle time;
// ok is false when it met none. g may be nil (none).
func (g *memGroup) pick(now int64, za zoneAlgo, keep []bucket.ID) (h [16]byte, at int64, ok bool) {
	if g == nil {
		return h, 0, false
	}
	seen := 0
	for k, b := range g.buckets {
		if slices.Contains(keep, bucket.ID{Zone: za.zone, Algo: za.algo, Hash: k}) {
			continue
		}
		if seen == 0 || b.IdleAt < at {
			h, at = k, b.IdleAt
		}
		if seen++; seen == evictSample || at <= now {
			break
		}
	}
	return h, at, seen > 0
}

// sweep drops sh's idle buckets and empty groups and trims sh to its
// limit; it returns how many buckets it dropped, and how many of them it
// evicted to trim it.
func (sh *memShard) sweep(now int64) (dropped, evicted int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	before := sh.n
	for za, g := range sh.groups {
		g.peak = max(g.peak, len(g.buckets))
		for k, b := range g.buckets {
			if b.IdleAt <= now {
				delete(g.buckets, k)
			}
		}
		if len(g.buckets) == 0 {
			delete(sh.groups, za)
		}
	}
	sh.count()
	evicted = sh.trim()
	for _, g := range sh.groups {
		// Go maps never shrink: after a flood of keys, copy the
		// survivors into a new map so that the memory of the flood is
		// released.
		if g.peak > 1024 && len(g.buckets) < g.peak/4 {
			g.buckets = shrink(g.buckets)
			g.peak = len(g.buckets)
		}
	}
	return before - sh.n, evicted
}

// count sets sh.n to the number of buckets its groups hold. Under sh's
// lock.
func (sh *memShard) count() {
	sh.n = 0
	for _, g := range sh.groups {
		sh.n += len(g.buckets)
	}
}

// trim evicts the least held back buckets of sh (the soonest idle) until
// it holds no more than its limit, and returns how many it evicted. It
// sorts the times of all of them: it runs in the sweep, which goes over
// them all anyway, and only once the capacity was lowered (or charges
// after a response brought back evicted buckets). Under sh's lock.
func (sh *memShard) trim() int {
	over := sh.n - sh.limit
	if over <= 0 {
		return 0
	}
	times := make([]int64, 0, sh.n)
	for _, g := range sh.groups {
		for _, b := range g.buckets {
			times = append(times, b.IdleAt)
		}
	}
	slices.Sort(times)
	// Evict those idle before last, and enough of those idle at last.
	last := times[over-1]
	before, _ := slices.BinarySearch(times, last)
	atLast := over - before
	for _, g := range sh.groups {
		for k, b := range g.buckets {
			switch {
			case b.IdleAt < last:
				delete(g.buckets, k)
			case b.IdleAt == last && atLast > 0:
				delete(g.buckets, k)
				atLast--
			}
		}
	}
	sh.count()
	return over
}

// shrink copies m into a map sized for its contents (maps.Clone would keep
// the old capacity).
func shrink(m map[[16]byte]bucket.State) map[[16]byte]bucket.State {
	n := make(map[[16]byte]bucket.State, len(m))
	for k, v := range m {
		n[k] = v
	}
	return n
}
