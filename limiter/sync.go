package limiter

import (
	"context"
	"time"
)

// Instances is the number of instances syncing with this one's Redis,
// this one included, as last counted.
func (l *Limiter) Instances() int {
	if l.sync == nil {
		return 1
	}
	return l.sync.Instances()
}

// SyncReady reports whether the instance hands out shares of the zones
// that sync (it is warm: see above); false without such zones.
func (l *Limiter) SyncReady() bool { return l.sync != nil && l.sync.Ready() }

// CountSync counts the instances syncing with this one's Redis (or
// storage), this one included, as a config with zones that sync of
// interval every loads. It registers nothing: the instance registers from
// its first request of such a zone.
func (l *Limiter) CountSync(ctx context.Context, every time.Duration) int {
	if l.sync == nil {
		return 1
	}
	return l.sync.Count(ctx, every)
}

// SyncShare is what this instance holds of req's bucket, of a zone that
// syncs: its allowance, what the last round (or reading) granted, and
// whether it keeps the bucket's entry at all.
func (l *Limiter) SyncShare(req Request) (allowance, granted int64, ok bool) {
	if l.sync == nil {
		return 0, 0, false
	}
	return l.sync.Share(req)
}
