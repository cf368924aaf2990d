package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

// The marks of the regions that exchange with this Redis's (see package
// limiter/regions): each region sets <prefix>{regions}:seen:<region> in
// the others' Redis at every exchange that succeeded, to its fingerprint,
// expiring after ttl; a region whose mark is absent from its own Redis is
// one the others cannot hear from. The keys share one hash slot
// ({regions}), so that one pipeline to one node reads them in a cluster.

// regionKey is the key of region's mark.
func (s *Store) regionKey(region string) string { return s.prefix + "{regions}:seen:" + region }

// MarkRegion marks region as having exchanged with this Redis now, for
// ttl, with mark.
func (s *Store) MarkRegion(ctx context.Context, region, mark string, ttl time.Duration) error {
	if err := s.client.Set(ctx, s.regionKey(region), mark, ttl).Err(); err != nil {
		return fmt.Errorf("mark of region %s: %w", region, err)
	}
	return nil
}

// RegionMarks reads the mark of each of regions in this Redis, "" for
// none, each at most limit bytes: a longer one is read cut to limit + 1
// bytes (and so cannot be taken for a mark that fits).
func (s *Store) RegionMarks(ctx context.Context, regions []string, limit int) ([]string, error) {
	if len(regions) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.StringCmd, len(regions))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range regions {
			cmds[i] = p.GetRange(ctx, s.regionKey(r), 0, int64(limit))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("marks of the regions: %w", err)
	}
	marks := make([]string, len(regions))
	for i, c := range cmds {
		marks[i] = c.Val()
	}
	return marks, nil
}

// Prepare readies this Redis for exchanges from another region: it
// connects to every master and loads there the scripts an exchange runs
// (the token bucket's, the quota's, the ban's), so that the first exchange costs one
// round trip, not four or five (a connection, the slot map, NOSCRIPT,
// the script's text).
func (s *Store) Prepare(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		for _, src := range []string{luascripts.TokenBucket, luascripts.Quota, luascripts.Ban} {
			if err := c.ScriptLoad(ctx, src).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	if c, ok := s.client.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return load(ctx, n) })
	}
	return load(ctx, s.client)
}
