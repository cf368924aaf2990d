package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// settleStore is a store of each kind with explicit times: take, charge
// and refund (of the takes that decided taken) at now.
type settleStore struct {
	take   func(now time.Time, reqs []Request) ([]Decision, error)
	charge func(now time.Time, reqs []Request) ([]Decision, error)
	refund func(now time.Time, reqs []Request, taken []Decision) ([]Decision, error)
}

var settleStores = map[string]func(t *testing.T) settleStore{
	"memory": func(t *testing.T) settleStore {
		s := memstore.New(time.Hour)
		t.Cleanup(func() { s.Close() })
		return settleStore{
			take:   func(now time.Time, reqs []Request) ([]Decision, error) { return s.TakeAt(now, reqs), nil },
			charge: func(now time.Time, reqs []Request) ([]Decision, error) { return s.ChargeAt(now, reqs), nil },
			refund: func(now time.Time, reqs []Request, taken []Decision) ([]Decision, error) {
				return s.RefundAt(now, reqs, taken), nil
			},
		}
	},
	"redis": func(t *testing.T) settleStore {
		return redisSettleStore(newRedisStore(t, redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})))
	},
	"cluster": func(t *testing.T) settleStore {
		return redisSettleStore(newRedisStore(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})))
	},
}

func redisSettleStore(s *redisstore.Store) settleStore {
	ctx := context.Background()
	return settleStore{
		take:   func(now time.Time, reqs []Request) ([]Decision, error) { return s.TakeAt(ctx, now, reqs) },
		charge: func(now time.Time, reqs []Request) ([]Decision, error) { return s.ChargeAt(ctx, now, reqs) },
		refund: func(now time.Time, reqs []Request, taken []Decision) ([]Decision, error) {
			return s.RefundAt(ctx, now, reqs, taken)
		},
	}
}

// settleStep is one operation of a timed sequence on one bucket, and what
// the store must answer.
type settleStep struct {
	op        string        // "take", "charge", or "refund": of the take of step ref
	at        time.Duration // since t0
	cost      int64
	ref       int
	allowed   bool
	remaining int64 // -1: not checked
	retry     time.Duration
}

// runSettleSteps runs steps against every store: memory, standalone
// Redis and Redis Cluster.
func runSettleSteps(t *testing.T, p Policy, steps []settleStep) {
	t.Helper()
	for name, newStore := range settleStores {
		t.Run(p.Algorithm.String()+"/"+name, func(t *testing.T) {
			s := newStore(t)
			taken := make([]Decision, len(steps))
			for i, st := range steps {
				req := Request{Zone: "z", Key: "k", Policy: p, Cost: st.cost, ID: fmt.Sprint("req-", i)}
				var d []Decision
				var err error
				switch st.op {
				case "take":
					d, err = s.take(t0.Add(st.at), []Request{req})
					taken[i] = d[0]
				case "charge":
					d, err = s.charge(t0.Add(st.at), []Request{req})
				case "refund":
					req.ID = fmt.Sprint("req-", st.ref)
					d, err = s.refund(t0.Add(st.at), []Request{req}, []Decision{taken[st.ref]})
				}
				if err != nil {
					t.Fatalf("step %d (%s): %v", i, st.op, err)
				}
				got := d[0]
				near := got.RetryAfter-st.retry > -time.Microsecond && got.RetryAfter-st.retry < time.Microsecond
				if got.Allowed != st.allowed || st.remaining >= 0 && got.Remaining != st.remaining || !near {
					t.Fatalf("step %d (%s at %s, cost %d): got %+v; want allowed %v, remaining %d, retry %s",
						i, st.op, st.at, st.cost, got, st.allowed, st.remaining, st.retry)
				}
			}
		})
	}
}

// TestRefund: a refund gives back its own take's charge, and nothing
// newer: after a charge of 2 and one of 1, refunding the first leaves the
// second counted, in every algorithm that refunds.
func TestRefund(t *testing.T) {
	steps := []settleStep{
		{op: "take", cost: 2, allowed: true, remaining: 3},
		{op: "take", cost: 1, allowed: true, remaining: 2},
		{op: "refund", cost: 2, ref: 0, allowed: true, remaining: 4},
		{op: "take", cost: 1, allowed: true, remaining: 3},
		{op: "take", cost: 3, allowed: true, remaining: 0},
		{op: "take", cost: 1, allowed: false, remaining: 0, retry: 0}, // retry checked per algorithm below
	}
	for _, p := range []Policy{
		{Algorithm: FixedWindow, Rate: 5, Period: time.Second, Burst: 5},
		{Algorithm: SlidingWindowLog, Rate: 5, Period: time.Second, Burst: 5},
		{Algorithm: SlidingWindowCounter, Rate: 5, Period: time.Second, Burst: 5},
		{Algorithm: TokenBucket, Rate: 5, Period: time.Second, Burst: 5},
		{Algorithm: LeakyBucket, Rate: 5, Period: time.Second, Burst: 4, NoDelay: true},
	} {
		s := append([]settleStep(nil), steps...)
		s[5].retry = map[Algorithm]time.Duration{FixedWindow: time.Second, SlidingWindowLog: time.Second,
			SlidingWindowCounter: 1200 * ms, TokenBucket: 200 * ms, LeakyBucket: 200 * ms}[p.Algorithm]
		runSettleSteps(t, p, s)
	}
}

// TestRefundAfterWindowTurned: a window's refund made once the next window
// has begun leaves the new window's count alone (a fixed window), or takes
// the charge off the previous count, where it still weighs (a counter).
// The refund tells the bucket at its own time.
func TestRefundAfterWindowTurned(t *testing.T) {
	runSettleSteps(t, Policy{Algorithm: FixedWindow, Rate: 5, Period: time.Second, Burst: 5}, []settleStep{
		{op: "take", at: 900 * ms, cost: 3, allowed: true, remaining: 2},
		{op: "take", at: 1100 * ms, cost: 1, allowed: true, remaining: 4},
		{op: "refund", at: 1100 * ms, cost: 3, ref: 0, allowed: true, remaining: 4}, // the new window's count stays
		{op: "take", at: 1100 * ms, cost: 1, allowed: true, remaining: 3},
	})
	runSettleSteps(t, Policy{Algorithm: SlidingWindowCounter, Rate: 10, Period: time.Second, Burst: 10}, []settleStep{
		{op: "take", at: 900 * ms, cost: 8, allowed: true, remaining: 2},
		{op: "take", at: 1500 * ms, cost: 1, allowed: true, remaining: 5},           // 10 - 8*0.5 - 1
		{op: "refund", at: 1500 * ms, cost: 8, ref: 0, allowed: true, remaining: 9}, // the previous count is 0
		{op: "take", at: 1500 * ms, cost: 1, allowed: true, remaining: 8},
		{op: "refund", at: 2500 * ms, cost: 1, ref: 3, allowed: true, remaining: 9}, // the previous count, now
		{op: "take", at: 2500 * ms, cost: 9, allowed: true, remaining: 0},
	})
}

// TestChargeDebt: a charge takes its cost whatever the bucket holds; a
// token or leaky bucket in debt refuses until the debt is repaid at its
// rate, and Retry-After says when. Windows are not charged.
func TestChargeDebt(t *testing.T) {
	// 10 tokens, one back every 100ms: a charge of 15 leaves 6 owed.
	runSettleSteps(t, Policy{Algorithm: TokenBucket, Rate: 10, Period: time.Second, Burst: 10}, []settleStep{
		{op: "take", cost: 1, allowed: true, remaining: 9},
		{op: "charge", cost: 15, allowed: true, remaining: 0},
		{op: "take", cost: 1, allowed: false, remaining: 0, retry: 700 * ms}, // 6 owed, then 1 to take
		{op: "take", at: 600 * ms, cost: 1, allowed: false, remaining: 0, retry: 100 * ms},
		{op: "take", at: 700 * ms, cost: 1, allowed: true, remaining: 0},
		{op: "take", at: 2700 * ms, cost: 10, allowed: true, remaining: 0}, // full again
	})
	// One leaves every 100ms, 2 may wait: a charge of 5 queues 600ms.
	runSettleSteps(t, Policy{Algorithm: LeakyBucket, Rate: 10, Period: time.Second, Burst: 2, NoDelay: true}, []settleStep{
		{op: "take", cost: 1, allowed: true, remaining: 2},
		{op: "charge", cost: 5, allowed: true, remaining: 0},
		{op: "take", cost: 1, allowed: false, remaining: 0, retry: 400 * ms},
		{op: "take", at: 400 * ms, cost: 1, allowed: true, remaining: 0},
	})
	runSettleSteps(t, Policy{Algorithm: FixedWindow, Rate: 5, Period: time.Second, Burst: 5}, []settleStep{
		{op: "take", cost: 1, allowed: true, remaining: 4},
		{op: "charge", cost: 100, allowed: false, remaining: 0}, // left alone: not asked
		{op: "take", cost: 1, allowed: true, remaining: 3},
	})
}

// TestChargeMaxDebt: a huge charge puts the bucket at most MaxDebt into
// debt.
func TestChargeMaxDebt(t *testing.T) {
	runSettleSteps(t, Policy{Algorithm: TokenBucket, Rate: 1, Period: time.Second, Burst: 1}, []settleStep{
		{op: "charge", cost: bucket.MaxCost, allowed: true, remaining: 0},
		{op: "take", cost: 1, allowed: false, remaining: 0, retry: bucket.MaxDebt + time.Second},
	})
}
