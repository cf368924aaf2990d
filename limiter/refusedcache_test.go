package limiter

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestRefusedCache(t *testing.T) {
	c := NewRefusedCache(100, time.Minute)
	p := Policy{Rate: 1, Period: time.Hour, Burst: 1}
	r := Request{Zone: "z", Key: "k", Policy: p, Cost: 2}
	c.Put(r, Decision{Allowed: true}, t0)
	if _, ok := c.Get(r, t0); ok {
		t.Fatal("an allowance was cached")
	}
	c.Put(r, Decision{Limit: 1, RetryAfter: 10 * time.Second}, t0)
	if d, ok := c.Get(r, t0.Add(4*time.Second)); !ok || d.RetryAfter != 6*time.Second || d.Allowed {
		t.Fatalf("Get = %+v, %v; want a refusal with 6s to wait", d, ok)
	}
	cheaper := r
	cheaper.Cost = 1
	if _, ok := c.Get(cheaper, t0); ok {
		t.Fatal("a cheaper request was refused from the cache")
	}
	raised := r
	raised.Policy.Burst = 10
	if _, ok := c.Get(raised, t0); ok {
		t.Fatal("a refusal held after the policy changed")
	}
	if _, ok := c.Get(r, t0.Add(10*time.Second)); ok {
		t.Fatal("hit after the retry time")
	}
	c.Put(r, Decision{RetryAfter: time.Hour}, t0)
	if d, ok := c.Get(r, t0.Add(30*time.Second)); !ok || d.RetryAfter != time.Hour-30*time.Second {
		t.Fatalf("Get = %+v, %v; want the whole wait left, not the cache's", d, ok)
	}
	if _, ok := c.Get(r, t0.Add(time.Minute)); ok {
		t.Fatal("kept longer than maxAge")
	}
	c.Delete(r)
	if _, ok := c.Get(r, t0); ok {
		t.Fatal("hit after Delete")
	}
	slot := Request{Zone: "z", Key: "k", Policy: Policy{Algorithm: Concurrency, Slots: 1}, Cost: 1}
	c.Put(slot, Decision{RetryAfter: time.Second}, t0)
	if _, ok := c.Get(slot, t0); ok {
		t.Fatal("a concurrency refusal was cached")
	}
}

func TestRefusedCacheBounded(t *testing.T) {
	c := NewRefusedCache(1000, time.Minute)
	p := Policy{Rate: 1, Period: time.Hour, Burst: 1}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10_000 {
				r := Request{Zone: "z", Key: fmt.Sprint(g, "-", i), Policy: p, Cost: 1}
				c.Put(r, Decision{RetryAfter: time.Second}, t0)
				c.Get(r, t0)
			}
		}()
	}
	wg.Wait()
	if n := c.Len(); n > 1000 {
		t.Fatalf("%d entries; want at most 1000", n)
	}
}
