package bucket

import (
	"testing"
	"time"
)

// BenchmarkCalendarAround: the periods a Redis quota's call carries,
// computed for each request.
func BenchmarkCalendarAround(b *testing.B) {
	c := Calendar{Month, mustLoc(&testing.T{}, "America/New_York")}
	now := time.Date(2025, 6, 14, 12, 0, 0, 0, time.UTC)
	for b.Loop() {
		_ = c.Around(now)
	}
}
