package ratelimit

import (
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// parseRate parses a zone's configured rate (bucket.ParseRate).
func parseRate(s string) (int64, time.Duration, error) {
	return bucket.ParseRate(s)
}
