package redisstore

import (
	"encoding/base64"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// redisDigestBytes is how much of a client key's digest (KeyHash) its
// Redis keys carry: 12 bytes (96 bits), 16 characters of base64url. Two
// of a hundred million clients share a bucket with a chance of about 1 in
// 10^13, and finding a key that shares a given client's bucket takes
// about 2^96 tries. The memory store keeps all 16 bytes.
const redisDigestBytes = 12

// keySuffixes end the Redis keys of other algorithms than the token
// bucket, one letter each: each algorithm keeps its state in its own shape
// (a string of its own, a sorted set), so a zone whose algorithm changes
// starts afresh instead of reading another's state. Bans add ":b" and ":r"
// (see banKeys), which no algorithm uses.
var keySuffixes = [...]string{
	bucket.TokenBucket:          "",
	bucket.FixedWindow:          ":f",
	bucket.SlidingWindowLog:     ":l",
	bucket.SlidingWindowCounter: ":c",
	bucket.LeakyBucket:          ":q", // a queue
	bucket.Concurrency:          ":m", // max_concurrent
	bucket.Quota:                ":u", // a quota's usage
}

// RedisKey is the Redis key of the token bucket of a client in zone, under
// prefix, where digest is KeyHash of the client key: prefix, then the
// first 12 bytes of the digest in base64url as the hash tag, then zone:
// "rl:{sNVsHSg5D35Ozgrj}:per_ip". Other algorithms add a suffix. The raw
// client key is not stored, keys have a bounded length, and the hash tag is
// the digest, so a client cannot pick the hash slot, while zones keyed by
// the same client share one slot (and one script run). For tools and
// tests that look into Redis.
func RedisKey(prefix, zone string, digest [16]byte) string {
	return redisKey(prefix, zone, digest, "")
}

// redisKey is RedisKey with suffix, in one allocation.
func redisKey(prefix, zone string, digest [16]byte, suffix string) string {
	var tag [redisDigestBytes * 4 / 3]byte // its base64url, unpadded
	base64.RawURLEncoding.Encode(tag[:], digest[:redisDigestBytes])
	return prefix + "{" + string(tag[:]) + "}:" + zone + suffix
}

// globalSuffix ends the key of a global zone's token bucket (package
// limiter/regions): the regions charge it, and a region where the zone is
// not global (yet, while global rolls out) keeps its own bucket apart.
const globalSuffix = ":g"

// key is the Redis key of r's state (see RedisKey and keySuffixes).
func (s *Store) key(r bucket.Request) string {
	a := r.Policy.Algorithm
	if r.Global && a == bucket.TokenBucket {
		return redisKey(s.prefix, r.Zone, r.Digest(), globalSuffix)
	}
	if int(a) < len(keySuffixes) {
		return redisKey(s.prefix, r.Zone, r.Digest(), keySuffixes[a])
	}
	return redisKey(s.prefix, r.Zone, r.Digest(), ":"+a.String())
}

// Key is the Redis key of the token bucket of key in zone.
func (s *Store) Key(zone, key string) string {
	return RedisKey(s.prefix, zone, bucket.KeyHash(key))
}

// Client is the store's Redis client.
func (s *Store) Client() redis.UniversalClient { return s.client }

// Prefix starts every key of the store.
func (s *Store) Prefix() string { return s.prefix }
