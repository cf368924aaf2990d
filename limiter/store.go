package limiter

import (
	"context"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// Store keeps the state of every bucket.
type Store interface {
	// Take charges every request's bucket, all or nothing: if one bucket
	// lacks the tokens, no bucket is charged. decisions[i] answers reqs[i].
	// The requests must name distinct (zone, key) pairs.
	Take(ctx context.Context, reqs []Request) (decisions []Decision, err error)
	// Release gives back the concurrency slots that Take gave reqs, when
	// their requests end. Requests of other algorithms are left alone.
	Release(ctx context.Context, reqs []Request) error
	// Refund gives back what Take charged reqs after all: of each
	// request's Cost (at most its take's), what its charge still holds
	// back now; taken[i] is the decision of reqs[i]'s take (a refused one
	// charged nothing: nothing is given back). A bucket never holds more
	// after a refund than it would have had the refunded cost never been
	// charged, nor more than its burst. A token or leaky bucket's charges
	// drain in real time, in the order of their takes: the charge that
	// ended the TAT at taken[i].Reset holds back, at now, min(Cost
	// intervals, Reset - now), which comes off the TAT (never back before
	// now), so that what has drained since, which the bucket may have
	// given a later request, is not given again. A window's count is given
	// back while the take's window (taken[i].At's) is counted; a sliding
	// log loses the take's own entries. Concurrency slots are left alone
	// (Release gives them back). decisions[i] tells reqs[i]'s bucket after
	// the refund, now (in Redis, on its server's clock).
	Refund(ctx context.Context, reqs []Request, taken []Decision) (decisions []Decision, err error)
	// Charge charges every request's bucket its Cost now, whatever it
	// holds: a token or leaky bucket may go into debt (its TAT moves on
	// beyond the burst, at most MaxDebt), and refuses requests until the
	// debt is repaid at its rate. Only the token and leaky buckets are
	// charged (Debt reports which); other requests are left alone.
	// decisions[i] tells reqs[i]'s bucket after the charge.
	Charge(ctx context.Context, reqs []Request) (decisions []Decision, err error)
	// Peek tells a bucket's state (remaining, reset) without changing it;
	// req.Cost is ignored.
	Peek(ctx context.Context, req Request) (Decision, error)
	// Reset drops a bucket, and its client's ban: it starts afresh.
	Reset(ctx context.Context, req Request) error
	// Banned is the ban left on the client of each of reqs (0: none; only
	// requests whose policy bans are looked up).
	Banned(ctx context.Context, reqs []Request) ([]time.Duration, error)
	// Refused counts a refusal of req's client for its policy's ban, and
	// returns the ban left when this refusal (or an earlier one) banned
	// it; started is true when this refusal started the ban.
	Refused(ctx context.Context, req Request) (left time.Duration, started bool, err error)
	// Close stops the store's background work and releases its resources.
	Close() error
}

// The bucket types, as the facade's callers name them (limiter/bucket
// holds them with their arithmetic).
type (
	Request   = bucket.Request
	Decision  = bucket.Decision
	Policy    = bucket.Policy
	Ban       = bucket.Ban
	Algorithm = bucket.Algorithm
	KeyHasher = bucket.KeyHasher
)

// The algorithms (bucket.Algorithm).
const (
	TokenBucket          = bucket.TokenBucket
	FixedWindow          = bucket.FixedWindow
	SlidingWindowLog     = bucket.SlidingWindowLog
	SlidingWindowCounter = bucket.SlidingWindowCounter
	LeakyBucket          = bucket.LeakyBucket
	Concurrency          = bucket.Concurrency
	Quota                = bucket.Quota
)

var (
	_ Store = (*memstore.Store)(nil)
	_ Store = (*redisstore.Store)(nil)
)

var _ fleetsync.Fleet = (*redisstore.Store)(nil)
