package limiter

import (
	"context"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// usageTimeout bounds a listing of a quota's usage, which scans Redis.
const usageTimeout = 10 * time.Second

// QuotaUsage is the n keys of zone, a quota of policy p, that used the
// most of the period that holds now, most first, as the store that
// decides them holds them; truncated says Redis held more keys than a
// listing reads (redisstore.MaxUsageScan per node).
func (l *Limiter) QuotaUsage(ctx context.Context, zone string, p Policy, now time.Time, n int) (uses []bucket.Use, truncated bool, err error) {
	if l.redis == nil {
		return l.memory.QuotaUsage(zone, p, now, n), false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, usageTimeout)
	defer cancel()
	return l.redis.QuotaUsage(ctx, zone, p, now, n)
}
