package bucket

import (
	"fmt"
	"time"
)

// InstanceShare is a zone's share of its limit on one of n instances: the
// rate divided by n (windows keep their length, buckets refill n times
// slower), and the burst or the slots divided by n, at least 1.
func InstanceShare(p Policy, n int) (Policy, error) {
	local := p
	switch {
	case p.Algorithm == Concurrency:
	case p.Algorithm.Windowed():
		local.Rate = max(p.Rate/int64(n), 1)
	case float64(p.Period)*float64(n) > float64(MaxPeriod):
		return p, fmt.Errorf("period %s times %d is longer than %s", p.Period, n, MaxPeriod)
	default:
		local.Period = p.Period * time.Duration(n)
	}
	local.Burst = max(p.Burst/int64(n), min(p.Burst, 1))
	local.Slots = max(p.Slots/int64(n), min(p.Slots, 1))
	if p.Algorithm.Windowed() {
		local.Burst = local.Rate
	}
	return local, local.Validate()
}
