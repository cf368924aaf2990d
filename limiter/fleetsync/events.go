package fleetsync

import (
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Events are told of the syncs' rounds, to count and log.
type Events interface {
	// Synced: a round of keys buckets took took; err when it failed.
	Synced(keys int, took time.Duration, err error)
	// InstancesChanged: the instances counted are n now.
	InstancesChanged(n int)
}

// pick is reqs at idx.
func pick(reqs []bucket.Request, idx []int) []bucket.Request {
	out := make([]bucket.Request, len(idx))
	for j, i := range idx {
		out[j] = reqs[i]
	}
	return out
}
