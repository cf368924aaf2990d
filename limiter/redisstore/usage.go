package redisstore

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// MaxUsageScan bounds the quota keys QuotaUsage reads on each node, and
// maxUsageCalls the SCAN calls it makes there (each looks at about
// usageBatch keys of the node, the zone's or not): on a node of millions
// of other keys, a listing stops, truncated, rather than walk them all.
// A value is read up to maxUsageValue bytes: a count is far shorter.
const (
	MaxUsageScan  = 100_000
	maxUsageCalls = 2000
	usageBatch    = 1000
	maxUsageValue = 64
)

// QuotaUsage is the n keys of zone, a quota of policy p, that used the
// most of the period that holds now, most first, from a SCAN of each
// master of at most MaxUsageScan of the zone's keys (truncated says a
// node had more).
func (s *Store) QuotaUsage(ctx context.Context, zone string, p bucket.Policy, now time.Time, n int) (uses []bucket.Use, truncated bool, err error) {
	start, _ := p.Calendar.Bounds(now)
	match := globEscape(s.prefix) + "{*}:" + globEscape(zone) + keySuffixes[bucket.Quota]
	var mu sync.Mutex
	scan := func(ctx context.Context, c *redis.Client) error {
		u, more, err := scanUses(ctx, c, match, start.UnixMicro())
		mu.Lock()
		defer mu.Unlock()
		uses, truncated = append(uses, u...), truncated || more
		return err
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, scan)
	} else if c, ok := s.client.(*redis.Client); ok {
		err = scan(ctx, c)
	}
	return bucket.TopUses(uses, n), truncated, err
}

// scanUses reads the counts of the period that starts at start (µs) of
// the keys of c that match, up to MaxUsageScan keys.
func scanUses(ctx context.Context, c *redis.Client, match string, start int64) ([]bucket.Use, bool, error) {
	var uses []bucket.Use
	var cursor uint64
	seen := 0
	for calls := 1; ; calls++ {
		keys, next, err := c.Scan(ctx, cursor, match, usageBatch).Result()
		if err != nil {
			return uses, false, err
		}
		pipe := c.Pipeline() // a GET per key: each its own slot
		gets := make([]*redis.StringCmd, len(keys))
		for i, k := range keys {
			gets[i] = pipe.GetRange(ctx, k, 0, maxUsageValue-1)
		}
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil && Unavailable(err) {
			return uses, false, err // one key's error reply (WRONGTYPE) is that key's
		}
		for i, g := range gets { // a key of another type (WRONGTYPE) is no count
			if u, ok := useOf(keys[i], g.Val(), start); ok && g.Err() == nil {
				uses = append(uses, u)
			}
		}
		seen += len(keys)
		if cursor = next; cursor == 0 {
			return uses, false, nil
		}
		if seen >= MaxUsageScan || calls >= maxUsageCalls {
			return uses, true, nil
		}
	}
}

// useOf is the use a quota key holds of the period that starts at start:
// "<count>:<start>", then, a global quota's, ":<own>" or "|" and its
// records (see quota.lua), which are not read.
func useOf(key, s string, start int64) (bucket.Use, bool) {
	count, at, ok := strings.Cut(s, ":")
	if end := strings.IndexAny(at, ":|"); end >= 0 {
		at = at[:end]
	}
	used, err1 := strconv.ParseInt(count, 10, 64)
	st, err2 := strconv.ParseInt(at, 10, 64)
	i, j := strings.IndexByte(key, '{'), strings.IndexByte(key, '}')
	if !ok || err1 != nil || err2 != nil || st != start || used <= 0 || i < 0 || j < i {
		return bucket.Use{}, false
	}
	digest, err := base64.RawURLEncoding.DecodeString(key[i+1 : j])
	if err != nil {
		return bucket.Use{}, false
	}
	return bucket.Use{Digest: hex.EncodeToString(digest), Used: used}, true
}

// globEscape is s with the characters of a SCAN pattern escaped.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
