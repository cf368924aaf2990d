package limiter

import (
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Key is the Redis key of the token bucket of key in zone, for the tests.
func (s *RedisStore) Key(zone, key string) string {
	return RedisKey(s.prefix, zone, bucket.KeyHash(key))
}
