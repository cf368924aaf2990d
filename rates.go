package ratelimit

import (
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// parseRate parses a zone's configured rate (limiter.ParseRate).
func parseRate(s string) (int64, time.Duration, error) {
	return limiter.ParseRate(s)
}
