package ratelimit

// The rate limit headers of a response: X-RateLimit-* and the IETF draft's
// RateLimit-Policy and RateLimit (ietf.go), written from what a zone's
// policy fixes (policyText, refusalbody.go) and the decision's numbers.

import (
	"cmp"
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"time"
	"unsafe"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// setLimitHeaders sets the headers that the Headers option chooses: what
// the policy fixes as written once (policyText), the numbers of the
// decision written together into one string.
func (h *Handler) setLimitHeaders(f *headerFields, o outcome) {
	x := h.Headers == "" || h.Headers == "x_ratelimit" || h.Headers == "both"
	ietf := h.ietfFields()
	if !x && !ietf {
		return
	}
	var room [96]byte
	b, cut := room[:0], [3]int{}
	if x {
		b = strconv.AppendInt(b, o.d.Remaining, 10)
		cut[0] = len(b)
		b = strconv.AppendInt(b, o.d.ResetUnix(), 10)
		cut[1] = len(b)
	}
	p, policy := o.req.Policy, ""
	q := cmp.Or(o.d.Limit, p.Limit()) // a zone not asked has no decision
	if ietf {
		// ietf.go: the policy (its quota and window), and the state
		// (remaining, seconds until more quota).
		switch {
		case p.Algorithm == limiter.Quota: // w: this period's length
			b = appendQuota(b, o.z.shown.quoted, periodPolicy(p, o.d, h.clock()), q)
		case q == o.text.limit:
			policy = o.text.quota
		default:
			b = appendQuota(b, o.z.shown.quoted, p, q)
		}
	}
	cut[2] = len(b)
	if ietf {
		b = appendState(b, o.z.shown.quoted, o.d.Remaining, resetSeconds(p, o.d, q, h.clock()))
	}
	nums := f.text(b)
	if x {
		f.set(hdrLimit, o.text.limitField(o.d.Limit))
		f.set(hdrRemaining, nums[:cut[0]])
		f.set(hdrReset, nums[cut[0]:cut[1]])
	}
	if ietf {
		f.set(hdrPolicy, cmp.Or(policy, nums[cut[1]:cut[2]]))
		f.set(hdrState, nums[cut[2]:])
	}
}

// ietfFields reports whether the Headers option sends the IETF fields.
func (h *Handler) ietfFields() bool { return h.Headers == "ietf" || h.Headers == "both" }

// clock is the handler's time: h.now, or the wall clock before Provision.
func (h *Handler) clock() time.Time {
	if h.now == nil {
		return time.Now()
	}
	return h.now()
}

// quotaWindow is RateLimit-Policy's w for the quota q of p, the limit
// that RateLimit's r counts down: the seconds in which the whole quota
// comes back. For the windows, the period; for the token and leaky
// buckets, the time to refill q tokens, q × Period / Rate, computed
// exactly (in floats, 45 × (1s/45) rounds up to 2s). Rounded up to whole
// seconds, at least 1.
func quotaWindow(p limiter.Policy, q int64) int64 {
	ns := uint64(p.Period)
	if !p.Algorithm.Windowed() {
		hi, lo := bits.Mul64(uint64(q), uint64(p.Period))
		if hi >= uint64(p.Rate) { // over 2^64 ns: no valid policy has it
			return math.MaxInt64 / int64(time.Second)
		}
		var rem uint64
		if ns, rem = bits.Div64(hi, lo, uint64(p.Rate)); rem > 0 {
			ns++
		}
	}
	s := ns / uint64(time.Second)
	if ns%uint64(time.Second) > 0 {
		s++
	}
	return int64(max(s, 1)) // s <= 2^64/1e9: an int64
}

// Header field names as http.CanonicalHeaderKey writes them, so that they
// are set as they are (Header.Set would write them so, per request).
const (
	hdrLimit         = "X-Ratelimit-Limit"
	hdrRemaining     = "X-Ratelimit-Remaining"
	hdrReset         = "X-Ratelimit-Reset"
	hdrPolicy        = "Ratelimit-Policy"
	hdrState         = "Ratelimit"
	hdrRetryAfter    = "Retry-After"
	hdrContentType   = "Content-Type"
	hdrContentLength = "Content-Length"
)

// headerFields sets header fields whose values share one array, made at the
// first, as http.Header.Clone makes them: each value is a slice of its own
// capacity, so that appending to one (Header.Add) leaves the others be.
type headerFields struct {
	hdr  http.Header
	room int // the values to come
	vals []string
	rest []byte // what is left of the bytes of vals' block (text)
}

// headerFields is room for a response's limit headers and, refused,
// three more.
func (h *Handler) headerFields(hdr http.Header, refused bool) headerFields {
	f := headerFields{hdr: hdr}
	switch h.Headers {
	case "", "x_ratelimit":
		f.room = 3
	case "ietf":
		f.room = 2
	case "both":
		f.room = 5
	}
	if refused {
		f.room += 3
	}
	return f
}

func (f *headerFields) set(key, value string) {
	if len(f.vals) == cap(f.vals) {
		f.vals = make([]string, 0, max(f.room-len(f.vals), 1))
	}
	f.vals = append(f.vals, value)
	n := len(f.vals)
	f.hdr[key] = f.vals[n-1 : n : n]
}

// The values of a response's limit fields (three of them, and the three a
// refusal adds) and the bytes of their numbers, made together: one
// allocation, not one for the values' array and one per string of digits.
type (
	fieldBlock struct {
		vals [3]string
		text [32]byte
	}
	refusalBlock struct {
		vals [6]string
		text [48]byte
	}
)

// text is b as a string: in the block of f's values, made here for
// them if it is the first (when they fit one), if b fits what is left of
// its bytes; else a string of its own. A block's bytes are written once,
// then are a string's, which is never written again.
func (f *headerFields) text(b []byte) string {
	if f.vals == nil && len(b) > 0 {
		switch {
		case f.room <= len(fieldBlock{}.vals):
			blk := new(fieldBlock)
			f.vals, f.rest = blk.vals[:0], blk.text[:]
		case f.room <= len(refusalBlock{}.vals):
			blk := new(refusalBlock)
			f.vals, f.rest = blk.vals[:0], blk.text[:]
		}
	}
	if len(b) == 0 || len(b) > len(f.rest) {
		return string(b)
	}
	n := copy(f.rest, b)
	s := unsafe.String(&f.rest[0], n)
	f.rest = f.rest[n:]
	return s
}
