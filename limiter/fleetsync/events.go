package fleetsync

import (
	"time"
)

// Events are told of the syncs' rounds, to count and log.
type Events interface {
	// Synced: a round of keys buckets took took; err when it failed.
	Synced(keys int, took time.Duration, err error)
	// InstancesChanged: the instances counted are n now.
	InstancesChanged(n int)
}
