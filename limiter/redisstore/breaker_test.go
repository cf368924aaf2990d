package redisstore

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	b := NewBreaker(3, time.Second)
	now := t0
	for i := range 2 {
		if !b.Allow(now) || b.Failure(now) {
			t.Fatalf("failure %d opened the breaker early", i+1)
		}
	}
	if !b.Allow(now) || !b.Failure(now) || !b.Open() {
		t.Fatal("third consecutive failure did not open the breaker")
	}
	if b.Allow(now.Add(999 * time.Millisecond)) {
		t.Fatal("call allowed during the cool-down")
	}
	later := now.Add(time.Second)
	if !b.Allow(later) {
		t.Fatal("no probe after the cool-down")
	}
	if b.Allow(later) {
		t.Fatal("two probes at once")
	}
	if b.Failure(later) || !b.Open() {
		t.Fatal("a failed probe must keep the breaker open, without reporting it opened again")
	}
	if b.Allow(later.Add(500 * time.Millisecond)) {
		t.Fatal("call allowed during the second cool-down")
	}
	if !b.Allow(later.Add(time.Second)) || !b.Success() || b.Open() {
		t.Fatal("a successful probe must close the breaker")
	}
	// Successes reset the count: two more failures do not open it.
	b.Failure(later)
	b.Failure(later)
	b.Success()
	if b.Failure(later) || b.Open() {
		t.Fatal("failures are not consecutive across a success")
	}
}
