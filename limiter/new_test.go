package limiter

import (
	"testing"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// mustNew is New(c) for a Config that cannot fail (memory, a storage).
func mustNew(t testing.TB, c Config) *Limiter {
	t.Helper()
	l, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// useRegions has l decide its global zones with x, which it starts.
func useRegions(l *Limiter, x *regions.Exchange) {
	l.regions = x
	x.Start()
}
