package limiter

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAllOrNothing(t *testing.T) {
	for name, newStore := range testStores {
		// One key: both zones in one hash slot (one script run). Two keys:
		// two slots in a cluster, so a refused request is refunded.
		for _, tightKey := range []string{"k", "other"} {
			t.Run(name+"/"+tightKey, func(t *testing.T) { testAllOrNothing(t, newStore(t), tightKey) })
		}
	}
}

func testAllOrNothing(t *testing.T, take takeAtFunc, tightKey string) {
	loose := Request{Zone: "loose", Key: "k", Policy: Policy{Rate: 100, Period: time.Minute, Burst: 100}, Cost: 1}
	tight := Request{Zone: "tight", Key: tightKey, Policy: Policy{Rate: 2, Period: time.Minute, Burst: 2}, Cost: 1}
	for i := range 5 {
		d, err := take(t0, []Request{loose, tight})
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 2; d[0].Allowed != true || d[1].Allowed != want {
			t.Fatalf("request %d: loose %v tight %v; want true %v", i, d[0].Allowed, d[1].Allowed, want)
		}
	}
	// Three refusals by the tight zone took nothing from the loose one.
	if d, err := take(t0, []Request{loose}); err != nil || d[0].Remaining != 97 {
		t.Fatalf("loose zone remaining %d (%v); want 97", d[0].Remaining, err)
	}
}

func TestMemoryZonesAndKeysAreDistinct(t *testing.T) {
	s := NewMemoryStore(time.Hour)
	defer s.Close()
	p := Policy{Rate: 1, Period: time.Minute, Burst: 1}
	for _, r := range []Request{{Zone: "a", Key: "k"}, {Zone: "b", Key: "k"}, {Zone: "a", Key: "j"}, {Zone: "a", Key: ""}} {
		r.Policy, r.Cost = p, 1
		if d := s.TakeAt(t0, []Request{r})[0]; !d.Allowed {
			t.Fatalf("%+v refused: buckets are shared", r)
		}
	}
}

func TestMemorySweepDropsFullBuckets(t *testing.T) {
	s := NewMemoryStore(time.Hour)
	defer s.Close()
	p := Policy{Rate: 1, Period: time.Second, Burst: 10}
	for i := range 1000 {
		s.TakeAt(t0, []Request{{Zone: "z", Key: fmt.Sprint(i), Policy: p, Cost: int64(1 + i%10)}})
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
	if d := s.TakeAt(t0.Add(10*time.Second), []Request{{Zone: "z", Key: "9", Policy: p, Cost: 1}})[0]; d.Remaining != 9 {
		t.Fatalf("remaining after sweep %d; want 9", d.Remaining)
	}
}

func TestMemoryConcurrentExact(t *testing.T) {
	s := NewMemoryStore(time.Millisecond) // the sweeper runs during the test
	defer s.Close()
	p := Policy{Rate: 1, Period: time.Hour, Burst: 50}
	other := Policy{Rate: 1, Period: time.Hour, Burst: 1000}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				reqs := []Request{
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
	s := NewMemoryStore(time.Millisecond)
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
	s := NewMemoryStore(time.Hour)
	defer s.Close()
	p := Policy{Rate: 1, Period: time.Second, Burst: 1}
	for i := range 100_000 {
		s.TakeAt(t0, []Request{{Zone: "z", Key: fmt.Sprint(i), Policy: p, Cost: 1}})
	}
	s.Sweep(t0.Add(time.Second))
	for i := range s.shards {
		if s.shards[i].peak != 0 {
			t.Fatalf("shard %d: map not rebuilt after the flood (peak %d)", i, s.shards[i].peak)
		}
	}
}

func BenchmarkMemoryTake(b *testing.B) {
	s := NewMemoryStore(0)
	defer s.Close()
	p := Policy{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			s.Take(b.Context(), []Request{{Zone: "z", Key: keys[i%len(keys)], Policy: p, Cost: 1}})
			i++
		}
	})
}
