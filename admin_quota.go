package ratelimit

// What the admin API shows of a quota: a key's use of its period.

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// quotaUsage is a lookup's account of a quota's period: what the key
// used of it (the store's count: more than the quota in force when the
// key was counted under a larger one), when it started and
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
	used := d.Used
	u.Used, u.PeriodStart, u.ResetsAt = &used, start.In(loc).Format(time.RFC3339), end.In(loc).Format(time.RFC3339)
}

// Bounds of a usage listing's top (GET /rate_limit/zones/<zone>/usage).
const (
	defaultUsageTop = 100
	maxUsageTop     = 1000
)

// usageListing is GET /rate_limit/zones/<zone>/usage: the keys that used
// the most of a quota's period, by digest, most first.
type usageListing struct {
	Zone        string       `json:"zone"`
	PeriodStart string       `json:"period_start"`
	ResetsAt    string       `json:"resets_at"`
	Keys        []bucket.Use `json:"keys"`
	// Truncated says that Redis held more of the zone's keys than a
	// listing reads: the top is of those read.
	Truncated bool `json:"truncated,omitempty"`
}

// usagePath is the zone of "zones/<zone>/usage", if path is one.
func usagePath(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "zones/")
	zone, ok2 := strings.CutSuffix(rest, "/usage")
	if !ok || !ok2 || strings.Contains(zone, "/") {
		return "", false
	}
	zone, err := url.PathUnescape(zone)
	return zone, err == nil
}

// serveUsage serves GET /rate_limit/zones/<zone>/usage[?top=<n>].
func serveUsage(w http.ResponseWriter, r *http.Request, zone string) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: GET", r.Method)}
	}
	ref, found := lookupZone(zone)
	if !found {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no zone %q", zone)}
	}
	p := ref.z.policy
	if p.Algorithm != limiter.Quota {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("zone %q is no quota: usage lists a quota's period", zone)}
	}
	top := defaultUsageTop
	if s := r.URL.Query().Get("top"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxUsageTop {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("top %q: want 1 to %d", s, maxUsageTop)}
		}
		top = n
	}
	now := ref.h.clock()
	uses, truncated, err := ref.h.store.QuotaUsage(r.Context(), zone, p, now, top) // within its own timeout
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("reading the zone's usage: %w", err)}
	}
	start, end := p.Calendar.Bounds(now)
	loc := p.Calendar.Location()
	return writeJSON(w, usageListing{Zone: zone, PeriodStart: start.In(loc).Format(time.RFC3339), ResetsAt: end.In(loc).Format(time.RFC3339),
		Keys: append([]bucket.Use{}, uses...), Truncated: truncated})
}
