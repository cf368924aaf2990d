package limiter

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestRefundAfterRefill: a refund gives back only what its charge still
// holds back. The repro of count_status 401 on POST /login, 6r/m burst 3:
// 3 good logins taken at t0 are held; at 31s the bucket is full again and
// 3 bad logins (counted) empty it; the good ones end (refunded, at 31.01s),
// and the next bad login must be refused: the good ones' charges had
// drained, there is nothing left to give back. The windows (3 per 12 s)
// and the log, whose windows have turned or whose entries have left, give
// back nothing either.
func TestRefundAfterRefill(t *testing.T) {
	const refundAt = 31*time.Second + 10*ms
	steps := []settleStep{
		{op: "take", cost: 1, allowed: true, remaining: 2}, // 3 good logins
		{op: "take", cost: 1, allowed: true, remaining: 1},
		{op: "take", cost: 1, allowed: true, remaining: 0},
		{op: "take", at: 31 * time.Second, cost: 1, allowed: true, remaining: 2}, // 3 bad logins
		{op: "take", at: 31 * time.Second, cost: 1, allowed: true, remaining: 1},
		{op: "take", at: 31 * time.Second, cost: 1, allowed: true, remaining: 0},
		{op: "refund", at: refundAt, cost: 1, ref: 0, allowed: true, remaining: 0}, // the good ones end: nothing back
		{op: "refund", at: refundAt, cost: 1, ref: 1, allowed: true, remaining: 0},
		{op: "refund", at: refundAt, cost: 1, ref: 2, allowed: true, remaining: 0},
		{op: "take", at: refundAt, cost: 1, allowed: false, remaining: 0}, // a bad login: refused
	}
	for _, c := range []struct {
		p     Policy
		cost  int64         // of the last take
		retry time.Duration // of the last take
	}{
		{Policy{Algorithm: TokenBucket, Rate: 6, Period: time.Minute, Burst: 3}, 1, 9990 * ms}, // a token at 41s
		{Policy{Algorithm: LeakyBucket, Rate: 6, Period: time.Minute, Burst: 2, NoDelay: true}, 1, 9990 * ms},
		{Policy{Algorithm: FixedWindow, Rate: 3, Period: 12 * time.Second, Burst: 3}, 1, 4990 * ms},       // the window of 24s..36s
		{Policy{Algorithm: SlidingWindowLog, Rate: 3, Period: 12 * time.Second, Burst: 3}, 1, 11990 * ms}, // the bad logins leave at 43s
		// 3 bad logins more (a cost whose retry is exact in floats): once
		// this window's count has faded, at 48s
		{Policy{Algorithm: SlidingWindowCounter, Rate: 3, Period: 12 * time.Second, Burst: 3}, 3, 16990 * ms},
	} {
		s := append([]settleStep(nil), steps...)
		s[len(s)-1].cost, s[len(s)-1].retry = c.cost, c.retry
		runSettleSteps(t, c.p, s)
	}
}

// TestRefundInFlight: requests refunded one after another, while the
// later ones still wait, get back what of their charges has not drained:
// 3 taken at t0 and refunded at 1s, 2s and 3s leave the bucket full.
func TestRefundInFlight(t *testing.T) {
	steps := []settleStep{
		{op: "take", cost: 1, allowed: true, remaining: 2},
		{op: "take", cost: 1, allowed: true, remaining: 1},
		{op: "take", cost: 1, allowed: true, remaining: 0},
		{op: "refund", at: time.Second, cost: 1, ref: 0, allowed: true, remaining: 1}, // the first had drained 1s of its 10s
		{op: "refund", at: 2 * time.Second, cost: 1, ref: 1, allowed: true, remaining: 2},
		{op: "refund", at: 3 * time.Second, cost: 1, ref: 2, allowed: true, remaining: 3},
		{op: "take", at: 3 * time.Second, cost: 3, allowed: true, remaining: 0},
	}
	for _, p := range []Policy{
		{Algorithm: TokenBucket, Rate: 6, Period: time.Minute, Burst: 3},
		{Algorithm: LeakyBucket, Rate: 6, Period: time.Minute, Burst: 2, NoDelay: true},
		{Algorithm: FixedWindow, Rate: 3, Period: 12 * time.Second, Burst: 3},
		{Algorithm: SlidingWindowLog, Rate: 3, Period: 12 * time.Second, Burst: 3},
		{Algorithm: SlidingWindowCounter, Rate: 3, Period: 12 * time.Second, Burst: 3},
		withCalendar(Policy{Algorithm: Quota, Rate: 3, Burst: 3}),
	} {
		runSettleSteps(t, p, steps)
	}
}

// TestRefundLogWithoutID: a sliding log's refund of a request without an
// ID removes the entries of its take's time, not newer ones: 2 per 10s,
// taken at 0 and 1s, the first refunded at 2s; the next request waits for
// the second to leave, at 11s.
func TestRefundLogWithoutID(t *testing.T) {
	p := Policy{Algorithm: SlidingWindowLog, Rate: 2, Period: 10 * time.Second, Burst: 2}
	for name, newStore := range settleStores {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			req := []Request{{Zone: "z", Key: "k", Policy: p, Cost: 1}}
			first, err := s.take(t0, req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.take(t0.Add(time.Second), req); err != nil {
				t.Fatal(err)
			}
			if d, err := s.refund(t0.Add(2*time.Second), req, first); err != nil || d[0].Remaining != 1 {
				t.Fatalf("refund: %+v, %v; want 1 remaining", d, err)
			}
			if d, err := s.take(t0.Add(2*time.Second), req); err != nil || !d[0].Allowed {
				t.Fatalf("take after the refund: %+v, %v", d, err)
			}
			d, err := s.take(t0.Add(2*time.Second), req)
			if err != nil || d[0].Allowed || d[0].RetryAfter != 9*time.Second {
				t.Fatalf("take of a full log: %+v, %v; want refused for 9s (the entry of 1s kept)", d, err)
			}
		})
	}
}

// TestRefundNeverGivesMore: in random sequences of takes and refunds of a
// token and a leaky bucket, each store's bucket after a refund holds no
// more than it would had the refunded costs never been charged (the same
// takes charged, less what was refunded of them), and no more than its
// burst. One refunded request is in flight at a time; the others count.
func TestRefundNeverGivesMore(t *testing.T) {
	for _, p := range []Policy{
		{Algorithm: TokenBucket, Rate: 6, Period: time.Minute, Burst: 3},
		{Algorithm: LeakyBucket, Rate: 6, Period: time.Minute, Burst: 2, NoDelay: true},
	} {
		for name, newStore := range settleStores {
			t.Run(p.Algorithm.String()+"/"+name, func(t *testing.T) {
				for seed := range uint64(4) {
					checkRefunds(t, newStore(t), p, rand.New(rand.NewPCG(seed, 1)))
				}
			})
		}
	}
}

// checkRefunds runs a random sequence on s (see TestRefundNeverGivesMore).
func checkRefunds(t *testing.T, s settleStore, p Policy, rng *rand.Rand) {
	t.Helper()
	type charged struct {
		at   time.Time
		cost int64 // less what was refunded
	}
	var kept []charged
	// without: the TAT, at now, of the charges kept (as if the refunded
	// costs had never been charged), computed apart from the stores
	without := func(now time.Time) time.Time {
		var b bucket.State
		for i, c := range kept {
			if c.cost > 0 {
				b, _ = p.Charge(b, i > 0 && b.IdleAt > c.at.UnixNano(), c.at.UnixNano(), c.cost)
			}
		}
		return now.Add(time.Duration(p.GCRA(b, b.IdleAt > now.UnixNano(), now.UnixNano()).Wait))
	}
	pending, ref := -1, Decision{} // the request in flight, to refund, and its take
	now := t0
	req := []Request{{Zone: "z", Key: fmt.Sprint("k", rng.Uint64()), Policy: p}}
	for step := range 40 {
		now = now.Add(time.Duration(rng.IntN(8000)) * ms)
		if pending >= 0 && rng.IntN(3) == 0 {
			req[0].Cost = kept[pending].cost
			if rng.IntN(3) == 0 { // a part of it
				req[0].Cost = 1 + rng.Int64N(kept[pending].cost)
			}
			d, err := s.refund(now, req, []Decision{ref})
			if err != nil {
				t.Fatal(err)
			}
			kept[pending].cost -= req[0].Cost
			pending = -1
			if want := without(now); d[0].Reset.Before(want.Add(-time.Microsecond)) || d[0].Reset.Before(now) {
				t.Fatalf("step %d, refund of %d at %s: the bucket is full at %s; without the refunded costs, %s",
					step, req[0].Cost, now.Sub(t0), d[0].Reset.Sub(t0), want.Sub(t0))
			}
			continue
		}
		req[0].Cost = 1 + rng.Int64N(2)
		d, err := s.take(now, req)
		if err != nil {
			t.Fatal(err)
		}
		if d[0].Allowed {
			kept = append(kept, charged{now, req[0].Cost})
			if pending < 0 && rng.IntN(2) == 0 {
				pending, ref = len(kept)-1, d[0]
			}
		}
	}
}
