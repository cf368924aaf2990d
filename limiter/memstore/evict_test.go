package memstore

import (
	"fmt"
	"iter"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// The zones of the eviction repro: a login limit, an hourly quota and an
// API limit of 100 per second.
var (
	evictLogin = bucket.Policy{Rate: 3, Period: time.Minute, Burst: 3}
	evictQuota = bucket.Policy{Rate: 10, Period: time.Hour, Burst: 10}
	evictAPI   = bucket.Policy{Rate: 100, Period: time.Second, Burst: 100}
)

// TestMemoryFloodKeepsOtherZones is the eviction repro: a store of 6,400
// buckets filled with clients of an hourly quota, a login bucket drained,
// then a flood of 64,000 new keys in the API zone (over 3.2 s of the
// injected clock, or all at one instant). The flood evicts the API zone's
// own buckets: the drained login bucket is refused throughout, and of the
// quota clients it held before the flood the store loses at most one a
// shard (the first API bucket of a full shard with no API bucket takes the
// place of a bucket of the zone that holds the most there).
func TestMemoryFloodKeepsOtherZones(t *testing.T) {
	for _, step := range []time.Duration{50 * time.Microsecond, 0} {
		t.Run(fmt.Sprint("step=", step), func(t *testing.T) { testFloodKeepsOtherZones(t, step) })
	}
}

func testFloodKeepsOtherZones(t *testing.T, step time.Duration) {
	const capacity = 6400
	s := New(time.Hour)
	defer s.Close()
	s.SetCapacity(capacity)
	quota := func(i int) bucket.Request {
		return bucket.Request{Zone: "quota", Key: fmt.Sprint("q", i), Policy: evictQuota, Cost: 1}
	}
	for i := range capacity {
		s.TakeAt(t0, []bucket.Request{quota(i)})
	}
	login := bucket.Request{Zone: "login", Key: "victim", Policy: evictLogin, Cost: 3}
	if d := s.TakeAt(t0, []bucket.Request{login}); !d[0].Allowed {
		t.Fatal("the login bucket did not take its burst")
	}
	login.Cost = 1
	held := map[int]bool{} // the quota clients the store holds before the flood
	for i := range capacity {
		if s.holds(quota(i)) {
			held[i] = true
		}
	}
	now, extra := t0, 0
	for i := range 64_000 {
		now = now.Add(step)
		s.TakeAt(now, []bucket.Request{{Zone: "api", Key: fmt.Sprint("a", i), Policy: evictAPI, Cost: 1}})
		if i%1000 == 999 && s.TakeAt(now, []bucket.Request{login})[0].Allowed {
			extra++
		}
	}
	if n := s.Len(); n > capacity {
		t.Fatalf("Len = %d after the flood; want at most the capacity, %d", n, capacity)
	}
	lost := 0 // read without a take, which would add the evicted again
	for i := range held {
		if !s.holds(quota(i)) {
			lost++
		}
	}
	if extra > 0 || lost > memShards {
		t.Fatalf("a flood of 64,000 new API keys gave the drained login bucket %d extra attempts and %d of %d quota clients a fresh bucket; want none, and at most %d (one a shard)",
			extra, lost, len(held), memShards)
	}
}

// holds reports whether s holds r's bucket.
func (s *Store) holds(r bucket.Request) bool {
	k := bucket.IDOf(r)
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, ok := sh.get(k)
	return ok
}

// all is every bucket of sh, in all its groups (not under its lock).
func (sh *memShard) all() iter.Seq2[bucket.ID, bucket.State] {
	return func(yield func(bucket.ID, bucket.State) bool) {
		for za, g := range sh.groups {
			for h, b := range g.buckets {
				if !yield(bucket.ID{Zone: za.zone, Algo: za.algo, Hash: h}, b) {
					return
				}
			}
		}
	}
}
