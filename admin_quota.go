package ratelimit

// What the admin API shows of a quota: a key's use of its period.

import (
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// quotaUsage is a lookup's account of a quota's period: what the key
// used of it (the quota in force less what remains), when it started and
// when it resets, in the zone's time zone (RFC 3339).
type quotaUsage struct {
	Used        *int64 `json:"used,omitempty"`
	PeriodStart string `json:"period_start,omitempty"`
	ResetsAt    string `json:"resets_at,omitempty"`
}

// setQuota records in u the period of quota p that decision d (a peek,
// at now) shows.
func (u *usage) setQuota(p limiter.Policy, d limiter.Decision, now time.Time) {
	if p.Algorithm != limiter.Quota {
		return
	}
	start, end := periodOf(p, d, now)
	loc := p.Calendar.Location()
	used := max(p.Rate-d.Remaining, 0)
	u.Used, u.PeriodStart, u.ResetsAt = &used, start.In(loc).Format(time.RFC3339), end.In(loc).Format(time.RFC3339)
}
