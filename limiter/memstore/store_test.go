package memstore

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

func TestMemoryZonesAndKeysAreDistinct(t *testing.T) {
	s := New(time.Hour)
	defer s.Close()
	p := bucket.Policy{Rate: 1, Period: time.Minute, Burst: 1}
	for _, r := range []bucket.Request{{Zone: "a", Key: "k"}, {Zone: "b", Key: "k"}, {Zone: "a", Key: "j"}, {Zone: "a", Key: ""}} {
		r.Policy, r.Cost = p, 1
		if d := s.TakeAt(t0, []bucket.Request{r})[0]; !d.Allowed {
			t.Fatalf("%+v refused: buckets are shared", r)
		}
	}
}

func TestMemorySweepDropsFullBuckets(t *testing.T) {
	s := New(time.Hour)
	defer s.Close()
	p := bucket.Policy{Rate: 1, Period: time.Second, Burst: 10}
	for i := range 1000 {
		s.TakeAt(t0, []bucket.Request{{Zone: "z", Key: fmt.Sprint(i), Policy: p, Cost: int64(1 + i%10)}})
	}
	if n := s.Len(); n != 1000 {
		t.Fatalf("Len = %d; want 1000", n)
	}
	// After 5s, buckets that lost at most 5 tokens are full again.
	if dropped := s.Sweep(t0.Add(5 * time.Second)); dropped != 500 {
		t.Fatalf("Sweep dropped %d; want 500", dropped)
	}
	s.Sweep(t0.Add(10 * time.Second))
	if n := s.Len(); n != 0 {
		t.Fatalf("Len after all refilled = %d; want 0", n)
	}
	// A dropped bucket is a full one.
	if d := s.TakeAt(t0.Add(10*time.Second), []bucket.Request{{Zone: "z", Key: "9", Policy: p, Cost: 1}})[0]; d.Remaining != 9 {
		t.Fatalf("remaining after sweep %d; want 9", d.Remaining)
	}
}

func TestMemoryConcurrentExact(t *testing.T) {
	s := New(time.Millisecond) // the sweeper runs during the test
	defer s.Close()
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 50}
	other := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 1000}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				reqs := []bucket.Request{
					{Zone: "shared", Key: "k", Policy: p, Cost: 1},
					{Zone: "own", Key: fmt.Sprint(g, i%7), Policy: other, Cost: 1},
				}
				d, _ := s.Take(t.Context(), reqs)
				if d[0].Allowed && d[1].Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	// 1r/h refills well under one token during the test.
	if n := allowed.Load(); n != 50 {
		t.Fatalf("allowed %d of 1600 concurrent requests; want exactly the burst, 50", n)
	}
}

func TestMemoryCloseStopsSweeper(t *testing.T) {
	s := New(time.Millisecond)
	done := make(chan struct{})
	go func() {
		s.Close()
		s.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
}

func TestMemoryFloodShrinks(t *testing.T) {
	s := New(time.Hour)
	defer s.Close()
	p := bucket.Policy{Rate: 1, Period: time.Second, Burst: 1}
	for i := range 100_000 {
		s.TakeAt(t0, []bucket.Request{{Zone: "z", Key: fmt.Sprint(i), Policy: p, Cost: 1}})
	}
	held := bucket.Request{Zone: "z", Key: "held", Policy: bucket.Policy{Rate: 1, Period: time.Hour, Burst: 1}, Cost: 1}
	s.TakeAt(t0, []bucket.Request{held})
	s.Sweep(t0.Add(time.Second))
	for i := range s.shards {
		for za, g := range s.shards[i].groups {
			if g.peak != 0 && g.peak != len(g.buckets) || len(g.buckets) == 0 {
				t.Fatalf("shard %d, group %v: map not rebuilt after the flood (%d buckets, peak %d)", i, za, len(g.buckets), g.peak)
			}
		}
	}
	if n := s.Len(); n != 1 || !s.holds(held) {
		t.Fatalf("Len %d after the sweep; want the held bucket alone", n)
	}
}

func BenchmarkMemoryTake(b *testing.B) {
	s := New(0)
	defer s.Close()
	p := bucket.Policy{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			s.Take(b.Context(), []bucket.Request{{Zone: "z", Key: keys[i%len(keys)], Policy: p, Cost: 1}})
			i++
		}
	})
}

// TestMemoryCapacityEvicts: filled beyond its capacity with distinct keys,
// the store keeps at most its capacity of buckets. A new bucket evicts
// the buckets that hold nothing back (full again) before those that do,
// so a client mid-limit keeps its state while idle buckets go, and every
// eviction is counted and reported.
func TestMemoryCapacityEvicts(t *testing.T) {
	const capacity = 4 * memShards // 4 a shard, under evictSample: the choice is exact
	s := New(time.Hour)
	defer s.Close()
	s.SetCapacity(capacity)
	var reported atomic.Int64
	s.OnEvict(func(n int) { reported.Add(int64(n)) })
	daily := bucket.Policy{Rate: 10, Period: 24 * time.Hour, Burst: 10}
	client := bucket.Request{Zone: "api", Key: "mid-limit", Policy: daily, Cost: 9} // full again in 21.6 h
	if d := s.TakeAt(t0, []bucket.Request{client}); !d[0].Allowed {
		t.Fatal("the client's first request was refused")
	}
	// capacity buckets that are full again after a second
	for i := range capacity {
		s.TakeAt(t0, []bucket.Request{{Zone: "short", Key: fmt.Sprint("idle-", i), Policy: bucket.Policy{Rate: 1, Period: time.Second, Burst: 1}, Cost: 1}})
	}
	// a minute later, capacity new clients, each full again in 2.4 h
	t1 := t0.Add(time.Minute)
	var flooded [memShards]int
	for i := range capacity {
		r := bucket.Request{Zone: "api", Key: fmt.Sprint("flood-", i), Policy: daily, Cost: 1}
		flooded[s.shardIndex(bucket.IDOf(r))]++
		if d := s.TakeAt(t1, []bucket.Request{r}); !d[0].Allowed {
			t.Fatalf("new client %d refused", i)
		}
	}
	n := s.Len()
	if n > capacity {
		t.Fatalf("Len = %d after %d distinct keys; want at most the capacity, %d", n, 2*capacity+1, capacity)
	}
	// Nothing was swept: every bucket that came in and is not held was evicted.
	if got, want := s.Evictions(), uint64(2*capacity+1-n); got != want || reported.Load() != int64(want) {
		t.Fatalf("Evictions() = %d, reported %d; want %d", got, reported.Load(), want)
	}
	// In each shard, a new client's bucket went only once no idle one was left.
	clientID := bucket.IDOf(client)
	for i := range s.shards {
		idle, kept := 0, 0
		for k, b := range s.shards[i].all() {
			switch {
			case b.IdleAt <= t1.UnixNano():
				idle++
			case k.Zone == "api" && k != clientID:
				kept++
			}
		}
		if idle > 0 && kept < flooded[i] {
			t.Errorf("shard %d: %d of %d new buckets evicted while %d idle ones stayed", i, flooded[i]-kept, flooded[i], idle)
		}
	}
	// The client mid-limit kept its state: one token left, then refused.
	client.Cost = 1
	if d := s.TakeAt(t1, []bucket.Request{client, client}); d[0].Remaining != 0 || d[1].Allowed {
		t.Fatalf("client mid-limit: remaining %d, second request allowed %v; want 0 and refused: its bucket was evicted",
			d[0].Remaining, d[1].Allowed)
	}
}

// TestMemoryCapacityLowered: a store over a lowered capacity comes back to
// it at its next sweep, keeping the buckets most held back; a refused take
// adds no bucket and evicts none; a capacity under a bucket a shard is
// raised to one, and none given is the default.
func TestMemoryCapacityLowered(t *testing.T) {
	s := New(time.Hour)
	defer s.Close()
	if got := s.Capacity(); got != DefaultCapacity {
		t.Fatalf("Capacity() = %d; want the default, %d", got, DefaultCapacity)
	}
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 1000}
	for i := range 1000 { // key i is full again in i+1 hours
		s.TakeAt(t0, []bucket.Request{{Zone: "z", Key: fmt.Sprint(i), Policy: p, Cost: int64(i + 1)}})
	}
	s.SetCapacity(200)
	if got := s.Capacity(); got != 200 {
		t.Fatalf("Capacity() = %d; want 200", got)
	}
	if dropped := s.Sweep(t0); dropped != 800 || s.Len() != 200 || s.Evictions() != 800 {
		t.Fatalf("sweep dropped %d, kept %d, evicted %d; want 800, 200, 800", dropped, s.Len(), s.Evictions())
	}
	// Each shard kept its most held back buckets: after one kept, every
	// bucket of its shard more held back is kept too.
	for i := range 1000 {
		r := bucket.Request{Zone: "z", Key: fmt.Sprint(i), Policy: p}
		kept := s.holds(r)
		for j := i + 1; j < 1000 && kept; j++ {
			o := bucket.Request{Zone: "z", Key: fmt.Sprint(j), Policy: p}
			if s.shardIndex(bucket.IDOf(o)) != s.shardIndex(bucket.IDOf(r)) {
				continue
			}
			if !s.holds(o) {
				t.Fatalf("key %d (full again in %d h) evicted, key %d (%d h) kept", j, j+1, i, i+1)
			}
		}
	}
	// A refused take, of a cost over the burst, keeps nothing.
	if d := s.TakeAt(t0, []bucket.Request{{Zone: "z", Key: "new", Policy: p, Cost: 1001}}); d[0].Allowed || s.Len() != 200 || s.Evictions() != 800 {
		t.Fatalf("refused take: allowed %v, Len %d, %d evictions; want refused, 200, 800", d[0].Allowed, s.Len(), s.Evictions())
	}
	s.SetCapacity(1)
	if got := s.Capacity(); got != MinCapacity {
		t.Fatalf("Capacity() = %d after SetCapacity(1); want %d", got, MinCapacity)
	}
}

// BenchmarkMemoryTakeFull is BenchmarkMemoryTake with a new key each time
// in a full store: each take evicts a bucket.
func BenchmarkMemoryTakeFull(b *testing.B) {
	s := New(0)
	defer s.Close()
	s.SetCapacity(64 * 1024)
	p := bucket.Policy{Rate: 10, Period: 24 * time.Hour, Burst: 10}
	keys := make([]string, 1<<20)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&255, i&255)
	}
	for _, k := range keys[:128*1024] { // full, and then some
		s.TakeAt(t0, []bucket.Request{{Zone: "z", Key: k, Policy: p, Cost: 1}})
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1<<19)) % len(keys) // each goroutine its own keys
		for pb.Next() {
			s.Take(b.Context(), []bucket.Request{{Zone: "z", Key: keys[i%len(keys)], Policy: p, Cost: 1}})
			i++
		}
	})
	if s.Len() > 64*1024 {
		b.Fatalf("Len %d over the capacity", s.Len())
	}
}

// TestMemoryFloodEvictsItsOwnZone: a flood of new keys in one zone, whose
// buckets hold back longer than a drained client's of another zone, evicts
// the flood's own buckets, not the drained client's (which would let it
// start afresh).
func TestMemoryFloodEvictsItsOwnZone(t *testing.T) {
	s := New(time.Hour)
	defer s.Close()
	s.SetCapacity(256)
	now := time.Unix(1e9, 0)
	login := bucket.Request{Zone: "login", Key: "victim", Policy: bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 5, Period: time.Hour, Burst: 5}, Cost: 5}
	if d := s.TakeAt(now, []bucket.Request{login}); !d[0].Allowed {
		t.Fatal("the login bucket did not take its burst")
	}
	flood := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: 2 * time.Hour, Burst: 1}
	for i := range 5000 {
		s.TakeAt(now, []bucket.Request{{Zone: "flood", Key: fmt.Sprint("k", i), Policy: flood, Cost: 1}})
	}
	login.Cost = 1
	if d := s.TakeAt(now, []bucket.Request{login}); d[0].Allowed {
		t.Fatalf("after a flood of 5000 keys in another zone, the drained login bucket passed: %+v", d[0])
	}
}

// t0 is the tests' clock.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// TakeInto decides as TakeAt, in the room it is given (whatever it held
// before), or in a slice of its own when the room is too small.
func TestMemoryTakeIntoIsTakeAt(t *testing.T) {
	a, b := New(time.Hour), New(time.Hour)
	defer a.Close()
	defer b.Close()
	p := bucket.Policy{Rate: 2, Period: time.Minute, Burst: 2}
	reqs := []bucket.Request{{Zone: "z", Key: "k", Policy: p, Cost: 1}, {Zone: "y", Key: "k", Policy: p, Cost: 1}}
	room := make([]bucket.Decision, 2)
	for i := range 4 {
		now := t0.Add(time.Duration(i) * time.Second)
		room[0], room[1] = bucket.Decision{Allowed: true, Remaining: 99}, bucket.Decision{Banned: true}
		want, got := a.TakeAt(now, reqs), b.TakeInto(now, reqs, room)
		if fmt.Sprint(got) != fmt.Sprint(want) || &got[0] != &room[0] {
			t.Fatalf("take %d: TakeInto = %+v (in the room: %t); want %+v", i, got, &got[0] == &room[0], want)
		}
	}
	if got := b.TakeInto(t0, reqs, room[:1:1]); len(got) != 2 || &got[0] == &room[0] {
		t.Fatalf("TakeInto with room for 1 of 2 = %+v, in the room", got)
	}
}
