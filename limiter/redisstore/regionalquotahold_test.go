package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestRegionalQuotaBothResume: two regions of a global quota (R = 2,
// D = 2 s) that each served a client in the morning, and were charged
// each other's admissions then, both hold by noon (each first asked hours
// ago, no peer charged for 2D). When the client comes back through both
// at once, neither may spend the whole quota left unseen by the other:
// the regions together stay within the quota and (R − 1) × ⌈quota / R⌉.
// A region that asks again after more than D without asking starts
// anew: it holds once it has asked for D, by when a peer that came back
// with it has charged it.
func TestRegionalQuotaBothResume(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 30, Burst: 30, Period: bucket.Day.Nominal(),
		Calendar: bucket.Calendar{Unit: bucket.Day}}
	const tag = "G2:2000000"
	a, b := newRedisStore(t, c), newRedisStore(t, c)
	take := func(s *Store, key string, at time.Duration) bool {
		t.Helper()
		r := bucket.Request{Zone: "gq", Key: key, Policy: p, Cost: 1, Global: true, ID: tag}
		d, err := s.TakeAt(context.Background(), t0.Add(at), []bucket.Request{r})
		if err != nil {
			t.Fatal(err)
		}
		return d[0].Allowed
	}
	charge := func(s *Store, id string, cost int64, at time.Duration) {
		t.Helper()
		r := bucket.Request{Zone: "gq", Key: "both", Policy: p, Cost: cost, Global: true,
			ID: fmt.Sprintf("%s@%d", id, dayEnd.UnixMicro())}
		now := strconv.FormatInt(t0.Add(at).UnixMicro(), 10)
		if err := s.settle(context.Background(), now, modeCharge, []bucket.Request{r}, []int{0}, nil, make([]bucket.Decision, 1)); err != nil {
			t.Fatal(err)
		}
	}
	admitted := 0
	for _, s := range []*Store{a, b} { // the morning: one request in each region
		if take(s, "both", -3*time.Hour) {
			admitted++
		}
	}
	charge(a, "n:b:1", 1, -3*time.Hour+time.Second)
	charge(b, "n:a:1", 1, -3*time.Hour+time.Second)
	inA, inB := 0, 0
	for range 30 { // noon: the client comes back through both at once
		if take(a, "both", 0) {
			inA++
		}
		if take(b, "both", 0) {
			inB++
		}
	}
	admitted += inA + inB
	if bound := 30 + 15; admitted > bound {
		t.Errorf("admitted %d in the day (%d by one region, %d by the other at noon); want at most %d, the quota and (R − 1) × ⌈quota / R⌉",
			admitted, inA, inB, bound)
	}
	charge(a, "n:b:2", int64(inB), time.Second) // D later each has heard of the other
	charge(b, "n:a:2", int64(inA), time.Second)
	if take(a, "both", 3*time.Second) || take(b, "both", 3*time.Second) {
		t.Errorf("after the exchange, the quota spent: admitted; want refused")
	}
	oneRegionBack(t, func(at time.Duration) bool { return take(a, "one", at) })
}

// oneRegionBack checks that a client of one region (take, at a time from
// t0) gets its whole quota of 30 there, D (2 s) after it comes back after
// hours.
func oneRegionBack(t *testing.T, take func(at time.Duration) bool) {
	t.Helper()
	take(-3 * time.Hour)
	got := 1
	for _, at := range []time.Duration{0, 2 * time.Second} {
		for range 30 {
			if take(at) {
				got++
			}
		}
	}
	if got != 30 {
		t.Errorf("a client of one region, back after hours: %d admitted by D after; want the whole quota, 30", got)
	}
}
