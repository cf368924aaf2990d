package ratelimit

// A zone's calendar quota: quota <n> per day|week|month|year, in a
// time_zone (see Zone.Quota).

import (
	"cmp"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// isQuota reports whether z is a quota, or names an option of one.
func (z *Zone) isQuota() bool {
	return z.Quota != "" || z.QuotaPer != "" || z.DefaultQuota != 0 || z.TimeZone != ""
}

// checkQuota checks a quota zone and computes its static (or default)
// policy and cost.
func (z *Zone) checkQuota() error {
	if err := z.quotaConflicts(); err != nil {
		return err
	}
	cal, err := quotaCalendar(z.QuotaPer, z.TimeZone)
	if err != nil {
		return err
	}
	n, err := staticQuota(z.Quota, z.DefaultQuota)
	if err != nil {
		return err
	}
	z.static = !hasPlaceholder(string(z.Quota)) && !hasPlaceholder(string(z.Cost))
	z.policy = limiter.Policy{Algorithm: limiter.Quota, Rate: n, Period: cal.Unit.Nominal(), Burst: n, Calendar: cal}
	if z.cost, err = staticCount("cost", z.Cost, z.DefaultCost, 1); err != nil {
		return err
	}
	if z.cost > n && !hasPlaceholder(string(z.Quota)) {
		return about(fmt.Errorf("cost %d is more than the quota, %d: every request would be refused", z.cost, n), "cost", "quota")
	}
	if z.policy.Ban, err = z.Ban.policy(); err != nil {
		return err
	}
	return cmp.Or(z.checkSettle(), z.checkSync(), z.policy.Validate())
}

// quotaConflicts refuses what does not go with a quota.
func (z *Zone) quotaConflicts() error {
	switch {
	case z.Quota == "":
		return about(fmt.Errorf("quota_per, default_quota and time_zone need a quota: quota <n> per day|week|month|year"), "time_zone")
	case z.Rate != "" || z.MaxEvents != 0:
		return about(fmt.Errorf("quota and a rate in one zone: use two zones, one with the quota and one with the rate "+
			"(a request must pass both)"), "quota", "rate", "events")
	case z.MaxConcurrent != 0:
		return about(fmt.Errorf("quota and max_concurrent in one zone: use two zones"), "quota", "max_concurrent")
	case z.Algorithm != "" || z.Burst != "" || z.DefaultBurst != 0 || z.NoDelay || z.Lease != 0:
		return about(fmt.Errorf("a quota counts requests per calendar period: algorithm, burst, nodelay and lease do not apply"),
			"quota", "algorithm", "burst", "nodelay", "lease")
	case z.Global && z.Sync > 0:
		return about(fmt.Errorf("a global quota is decided in each region's Redis, and does not sync: "+
			"leave sync out (each request is one call to the region's own Redis), or global out"), "global", "sync")
	}
	return nil
}

// quotaCalendar is the calendar of a period and a time zone.
func quotaCalendar(per, zone string) (bucket.Calendar, error) {
	if per == "" {
		return bucket.Calendar{}, about(fmt.Errorf("quota needs its period: quota <n> per day|week|month|year"), "quota")
	}
	unit, err := bucket.ParseCalendarUnit(per)
	if err != nil {
		return bucket.Calendar{}, about(fmt.Errorf("quota: %w", err), "quota")
	}
	loc, err := bucket.LoadLocation(zone)
	if err != nil {
		return bucket.Calendar{}, about(fmt.Errorf("time_zone: %w", err), "time_zone")
	}
	return bucket.Calendar{Unit: unit, Loc: loc}, nil
}

// staticQuota is the quota as configured: q's number, or, for a
// template, the default, which it then needs.
func staticQuota(q caddyhttp.WeakString, dflt int64) (int64, error) {
	s := string(q)
	if hasPlaceholder(s) {
		if dflt < 1 {
			return 0, about(fmt.Errorf("quota %q has placeholders: give a default quota of at least 1 after the period, "+
				"such as quota %s per month 1000", s, s), "quota")
		}
		s = strconv.FormatInt(dflt, 10)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > bucket.MaxRate {
		return 0, about(fmt.Errorf("quota %q: want a whole number of requests from 1 to %d per period", s, int64(bucket.MaxRate)), "quota")
	}
	return n, nil
}

// quotaLimits is a quota's policy p with the number its placeholders
// give, or p's (the default) when they give none valid.
func (z *Zone) quotaLimits(p limiter.Policy, repl *caddy.Replacer, warn func(error)) limiter.Policy {
	s := repl.ReplaceAll(string(z.Quota), "")
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > bucket.MaxRate {
		warn(fmt.Errorf("quota %s is not a whole number from 1 to %d", clip(s), int64(bucket.MaxRate)))
		return p
	}
	p.Rate, p.Burst = n, n
	return p
}

// parseQuota parses: quota <n|template> per <day|week|month|year>
// [<default n>].
func parseQuota(d *caddyfile.Dispenser, z *Zone) error {
	args := d.RemainingArgs()
	if len(args) < 3 || len(args) > 4 || args[1] != "per" {
		return d.Errf("zone %q: want quota <n> per day|week|month|year, such as quota 10000 per month", z.name)
	}
	z.Quota, z.QuotaPer = caddyhttp.WeakString(args[0]), args[2]
	if err := checkPlaceholders("quota", args[0]); err != nil {
		return d.Errf("zone %q: %v", z.name, err)
	}
	if len(args) == 4 {
		n, err := strconv.ParseInt(args[3], 10, 64)
		if err != nil || n < 1 || !hasPlaceholder(args[0]) {
			return d.Errf("zone %q: quota %s: the default after the period is for a quota from placeholders, a whole number of at least 1", z.name, args[3])
		}
		z.DefaultQuota = n
	}
	if _, err := quotaCalendar(z.QuotaPer, ""); err != nil {
		return d.Errf("zone %q: %v", z.name, err)
	}
	if _, err := staticQuota(z.Quota, z.DefaultQuota); err != nil {
		return d.Errf("zone %q: %v", z.name, err)
	}
	return nil
}

// parseTimeZone parses: time_zone <IANA name>.
func parseTimeZone(d *caddyfile.Dispenser, z *Zone) error {
	if err := oneArg(d, &z.TimeZone); err != nil {
		return err
	}
	if _, err := bucket.LoadLocation(z.TimeZone); err != nil {
		return d.Errf("zone %q: time_zone: %v", z.name, err)
	}
	return nil
}

// periodPolicy is quota p with Period the length of the period of
// decision d (which ends at d.Reset), or of now's when d has none: the
// w of the IETF fields.
func periodPolicy(p limiter.Policy, d limiter.Decision, now time.Time) limiter.Policy {
	start, end := periodOf(p, d, now)
	p.Period = end.Sub(start)
	return p
}

// periodOf is the quota period of decision d (its end is d.Reset), or
// of now when d has none.
func periodOf(p limiter.Policy, d limiter.Decision, now time.Time) (start, end time.Time) {
	if !d.Reset.IsZero() {
		now = d.Reset.Add(-time.Nanosecond)
	}
	return p.Calendar.Bounds(now)
}

// appendQuotaReset appends, for a refusal's message, when quota p resets
// (at end), in its time zone: "2025-06-02 00:00 NZST (Pacific/Auckland),
// in ".
func appendQuotaReset(b []byte, p limiter.Policy, end time.Time) []byte {
	loc := p.Calendar.Location()
	b = end.In(loc).AppendFormat(b, "2006-01-02 15:04 MST")
	return append(append(append(b, " ("...), loc.String()...), "), in "...)
}
