package ratelimit

// The IETF fields, RateLimit-Policy and RateLimit, and the quota-exceeded
// problem type of a refusal, as draft-ietf-httpapi-ratelimit-headers-10
// defines them (the text at the tag draft-ietf-httpapi-ratelimit-headers-10
// of github.com/ietf-wg-httpapi/ratelimit-headers). Both fields are
// Structured Field Lists (RFC 9651) of one Item, the zone's name as a
// String (zone names are letters, digits, '_', '-' and '.': Zone.check,
// so strconv.Quote writes them as a String):
//
//	RateLimit-Policy: "<zone>";q=<quota>;w=<seconds>
//	RateLimit-Policy: "<zone>";q=<slots>;qu="concurrent-requests"
//	RateLimit:        "<zone>";r=<remaining>;t=<seconds>
//
// q is the quota that r counts down (X-RateLimit-Limit's number); w, the
// seconds in which the whole quota comes back, is never 0 and is left out
// for a concurrency limit, which has no window. qu is left out where it
// is the draft's default, "requests": a cost weighs a request in the same
// unit ("whether a specific request actually consumes a quota unit is
// implementation-specific"); no zone counts content bytes. t is the
// seconds until more quota is available (see resetSeconds), left out
// when none is to come.
//
// The partition key, pk, is left out. It would be derived from the client
// key (an address, an API key, a token's subject): a raw key must never be
// echoed, and a digest of one with little entropy (an IPv4 address) is
// reversed by trying them all, unless keyed by a secret, which then makes
// it useless to a client that wants to predict it. The client knows its
// own identity, and each zone is one policy: the name tells them apart.

import (
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// appendQuota appends RateLimit-Policy's item for the quota q of p.
func appendQuota(b []byte, name string, p limiter.Policy, q int64) []byte {
	b = strconv.AppendInt(append(append(b, name...), ";q="...), q, 10)
	if p.Algorithm == limiter.Concurrency {
		return append(b, `;qu="concurrent-requests"`...)
	}
	return strconv.AppendInt(append(b, ";w="...), quotaWindow(p, q), 10)
}

// appendState appends RateLimit's item: r, and t unless it is negative.
func appendState(b []byte, name string, r, t int64) []byte {
	b = strconv.AppendInt(append(append(b, name...), ";r="...), max(r, 0), 10)
	if t < 0 {
		return b
	}
	return strconv.AppendInt(append(b, ";t="...), t, 10)
}

// resetSeconds is RateLimit's t for decision d of policy p (whose quota
// is q): the seconds, rounded up, from the decision (d.At, on the clock of
// the store that decided, as d.Reset is; now when the decision has no
// time) until more quota is available, or -1 when none is to come (the
// quota is whole, or, for a concurrency limit, no one can tell when a
// request in flight ends). For the token
// and leaky buckets (GCRA), the next unit: d.Reset is when the bucket is
// full, each unit before it one interval (Period / Rate) earlier. For the
// fixed window, the window's end; for the sliding log, when its oldest
// request leaves (d.Reset for both). The sliding window counter keeps no
// more than its two counts, which a decision does not carry: its t is when
// it is full again, the latest the next unit can come. A refusal's t is at
// most its wait, so that Retry-After is never earlier than t; a ban's is
// the ban's end.
func resetSeconds(p limiter.Policy, d limiter.Decision, q int64, now time.Time) int64 {
	if p.Algorithm == limiter.Concurrency {
		return -1
	}
	if d.Banned {
		return ceilSeconds(d.RetryAfter)
	}
	if d.Remaining >= q {
		return -1
	}
	if !d.At.IsZero() {
		now = d.At
	}
	next := float64(d.Reset.Sub(now))
	if (p.Algorithm == limiter.TokenBucket || p.Algorithm == limiter.LeakyBucket) && p.Rate > 0 {
		interval := float64(p.Period) / float64(p.Rate)
		next -= float64(q-max(d.Remaining, 0)-1) * interval
	}
	if !d.Allowed && d.RetryAfter > 0 {
		next = min(next, float64(d.RetryAfter))
	}
	return ceilSeconds(time.Duration(min(max(next, 0), math.MaxInt64/2)))
}

// ceilSeconds is d in whole seconds, rounded up; 0 when d is not positive.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// acceptsProblem reports whether r's Accept names application/problem+json
// with a q above 0 (a wildcard does not: such a client gets the
// configured body).
func acceptsProblem(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for rng := range strings.SplitSeq(v, ",") {
			mt, params, err := mime.ParseMediaType(rng)
			if err != nil || mt != "application/problem+json" {
				continue
			}
			if q, err := strconv.ParseFloat(params["q"], 64); params["q"] == "" || err == nil && q > 0 {
				return true
			}
		}
	}
	return false
}

// quotaExceededStart is the problem details of the draft's quota-exceeded
// type, up to the detail's string: its type URI, and the Title under which
// the draft registers it.
const quotaExceededStart = `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",` +
	`"title":"Quota Exceeded","status":429,"detail":`

// violatedPolicies is the violated-policies member of a quota-exceeded
// body: the names of the zone shown and of every other enforced zone that
// refused the request (the names of their RateLimit-Policy items).
func violatedPolicies(b []byte, o outcome, zones []*Zone, v *limiter.Verdict) []byte {
	b = append(append(b, `,"violated-policies":[`...), o.z.shown.zoneJSON...)
	if v != nil {
		for i, s := range v.States {
			if i < len(zones) && zones[i] != o.z && !v.Requests[i].DryRun &&
				(s == limiter.Refused || s == limiter.Banned || s == limiter.BanStarted) {
				b = append(append(b, ','), zones[i].shown.zoneJSON...)
			}
		}
	}
	return append(b, ']')
}
