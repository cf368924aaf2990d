package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// A decision's time budget (RedisOptions.Timeout) without a timer or a
// context tree of its own. context.WithTimeout costs four allocations and
// a timer per request (the context, its timer, its Done channel and the
// WithoutCancel parent); a budget is one small value, and whoever must
// wake at its deadline (batcher.do) waits on a timer from a pool.

// budget is a context that ends at its deadline and is never canceled: a
// client that leaves does not cut a call short (see takeRedis). Done is
// nil: batcher.do waits until Deadline on a pooled timer; go-redis sets
// its connections' deadlines from Deadline (ContextTimeoutEnabled), and a
// context derived from a budget (refundContext) gets timers of its own.
type budget struct{ start, deadline time.Time }

// newBudget is a budget of d from now.
func newBudget(d time.Duration) *budget { return budgetFrom(time.Now(), d) }

// budgetFrom is a budget of d from start (a clock reading the caller has).
func budgetFrom(start time.Time, d time.Duration) *budget {
	return &budget{start: start, deadline: start.Add(d)}
}

// budgets are the budgets of takes that ended with every command
// answered (a command whose caller left may still be queued, with its
// budget: such a budget is not given back).
var budgets = sync.Pool{New: func() any { return new(budget) }}

// expired reports whether the budget is spent at now.
func (b *budget) expired(now time.Time) bool { return !now.Before(b.deadline) }

func (b *budget) Deadline() (time.Time, bool) { return b.deadline, true }
func (b *budget) Done() <-chan struct{}       { return nil }
func (b *budget) Value(any) any               { return nil }

// Err is context.DeadlineExceeded once the deadline has passed.
func (b *budget) Err() error {
	if b.expired(time.Now()) {
		return context.DeadlineExceeded
	}
	return nil
}

// timers are stopped timers that batcher.do waits on (since Go 1.23, a
// stopped or reset timer delivers no stale tick).
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// TakeWithin is Take on a budget of d from start, from the pool: a
// decision's time without a timer or a context of its own.
func (s *Store) TakeWithin(start time.Time, d time.Duration, reqs []bucket.Request) ([]bucket.Decision, error) {
	b := budgets.Get().(*budget)
	*b = budget{start: start, deadline: start.Add(d)}
	decisions, err := s.Take(b, reqs)
	if err == nil { // every command answered: nothing holds b
		budgets.Put(b)
	}
	return decisions, err
}
