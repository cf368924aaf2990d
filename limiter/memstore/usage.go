package memstore

import (
	"encoding/hex"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// QuotaUsage is the n keys of zone, a quota of policy p, that used the
// most of the period that holds now, most first.
func (s *Store) QuotaUsage(zone string, p bucket.Policy, now time.Time, n int) []bucket.Use {
	var uses []bucket.Use
	za := zoneAlgo{zone, bucket.Quota}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if g := sh.groups[za]; g != nil {
			for digest, b := range g.buckets {
				if used := p.QuotaUsed(b, now.UnixNano()); used > 0 {
					uses = append(uses, bucket.Use{Digest: hex.EncodeToString(digest[:]), Used: used})
				}
			}
		}
		sh.mu.Unlock()
	}
	return bucket.TopUses(uses, n)
}
