package ratelimit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// The values of Handler.Response and Handler.Headers.
var (
	responseChoices = choices{"json", "problem", "handle_errors"}
	headersChoices  = choices{"x_ratelimit", "ietf", "both", "none"}
)

// checkResponseOptions checks response, headers and retry_after_jitter.
func (h *Handler) checkResponseOptions() error {
	if err := cmp.Or(responseChoices.check("response", h.Response), headersChoices.check("headers", h.Headers)); err != nil {
		return err
	}
	if j := time.Duration(h.RetryAfterJitter); j < 0 || j > 0 && j < time.Second {
		return fmt.Errorf("retry_after_jitter %s: want 0 or at least 1s (Retry-After counts whole seconds)", j)
	}
	return nil
}

// respond answers a request as its verdict says: the most restrictive
// zone sets the placeholders and headers (a dry-run zone may, with
// DryRunHeaders), and refuses the request or lets it go on to next (after
// a leaky bucket's wait); on_store_error's deny refuses it, its allow
// lets it pass.
func (h *Handler) respond(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, zones []*Zone, v *limiter.Verdict) error {
	if h.dryRefusals != nil {
		h.reportDryRun(r, zones, v) // refusallog.go
	}
	if v.BansStarted() {
		h.reportBans(r, zones, v) // refusallog.go
	}
	dry := h.dryRunOutcome(zones, v)
	i := v.Shown(false)
	if i < 0 { // no enforced zone decided: only dry-run ones, or on_store_error allow or deny
		if v.Refused() {
			dropLimitHeaders(w.Header())
			return h.deny(w, v.Calls[0].Err) // storeerror.go
		}
		if dry != nil {
			f := h.headerFields(w.Header(), false)
			h.setLimitHeaders(&f, *dry)
		}
		return next.ServeHTTP(w, r)
	}
	o := h.outcome(zones[i], v.Requests[i], v.Decisions[i])
	f := h.show(r, w.Header(), repl, o, dry)
	if !o.d.Allowed {
		h.reportRefusal(r, repl, o) // refusallog.go: placeholder, event, logs
		return h.refuse(w, &f, o)
	}
	if err := wait(r.Context(), v.MaxDelay()); err != nil {
		return caddyhttp.Error(499, fmt.Errorf("client left while its request waited its turn: %w", err))
	}
	if s := h.settlement(zones, v, repl, dry); s != nil { // settle.go: count_status, cost_from_response
		return s.serve(w, r, next)
	}
	return next.ServeHTTP(w, r)
}

// show sets the placeholders of o, and the limit headers in hdr: o's, or
// dry's when a dry-run zone shows less left to an allowed request. A
// refusal first drops the limit headers an outer handler set: none may
// say that quota is left. It returns the fields, with room for a
// refusal's.
func (h *Handler) show(r *http.Request, hdr http.Header, repl *caddy.Replacer, o outcome, dry *outcome) headerFields {
	o.setPlaceholders(r, repl)
	if !o.d.Allowed {
		dropLimitHeaders(hdr)
	}
	f := h.headerFields(hdr, !o.d.Allowed)
	if dry != nil && o.d.Allowed && dry.d.Remaining < o.d.Remaining {
		o = *dry
	}
	h.setLimitHeaders(&f, o)
	return f
}

// dropLimitHeaders drops the limit headers in hdr, before a refusal: an
// outer handler's must not say that quota is left.
func dropLimitHeaders(hdr http.Header) {
	for _, k := range [...]string{hdrLimit, hdrRemaining, hdrReset, hdrPolicy, hdrState} {
		delete(hdr, k)
	}
}

// dryRunOutcome is what the dry-run zones would show in the headers, as
// an allowance, with DryRunHeaders; else nil.
func (h *Handler) dryRunOutcome(zones []*Zone, v *limiter.Verdict) *outcome {
	if !h.DryRunHeaders {
		return nil
	}
	i := v.Shown(true)
	if i < 0 {
		return nil
	}
	d := v.Decisions[i]
	d.Allowed, d.RetryAfter = true, 0
	o := h.outcome(zones[i], v.Requests[i], d)
	return &o
}

// outcome is what a request is told: the deciding zone's decision.
type outcome struct {
	zone  string
	req   limiter.Request
	d     limiter.Decision
	retry int64 // Retry-After, seconds, jitter included; 0 when allowed
	// z is the zone, and text what its responses show for req's policy.
	z    *Zone
	text *policyText
}

func (h *Handler) outcome(z *Zone, req limiter.Request, d limiter.Decision) outcome {
	o := outcome{zone: z.name, req: req, d: d, z: z, text: z.shown.text(req.Policy)}
	if !d.Allowed {
		o.d.RetryAfter = h.withJitter(d.RetryAfter) // Jitter: a fraction of the wait
		o.retry = o.d.RetryAfterSeconds()
		if j := time.Duration(h.RetryAfterJitter); j >= time.Second {
			o.retry += rand.Int64N(int64(j/time.Second) + 1) // math/rand/v2: safe for concurrent use
		}
	}
	return o
}

// withJitter is the wait of a refusal with Jitter's random part: up to
// Jitter times the wait more (math/rand/v2's generator, safe for
// concurrent use).
func (h *Handler) withJitter(wait time.Duration) time.Duration {
	if h.Jitter <= 0 || wait <= 0 {
		return wait
	}
	extra := rand.Float64() * h.Jitter * float64(wait)
	return time.Duration(min(float64(wait)+extra, math.MaxInt64/2))
}

// setPlaceholders sets the {http.rate_limit.*} placeholders of r to o:
// in the request's shownState, whose provider answers them (a value is
// boxed only when read); without Caddy's request vars (a test's bare
// request), in the replacer's own table.
func (o outcome) setPlaceholders(r *http.Request, repl *caddy.Replacer) {
	vars, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if !ok {
		st := &shownState{shownValues: o.shown()}
		for _, name := range shownNames {
			v, _ := st.placeholder(name)
			repl.Set(name, v)
		}
		return
	}
	st, _ := vars[shownStateVar].(*shownState)
	if st == nil {
		st = new(shownState)
		repl.Map(st.placeholder)
		vars[shownStateVar] = st
	}
	st.mu.Lock()
	st.shownValues = o.shown()
	st.mu.Unlock()
}

// shownStateVar names the request's shownState among Caddy's request vars.
const shownStateVar = "rate_limit_shown"

// shownState is what a request's {http.rate_limit.*} placeholders show:
// the decision of the last rate_limit handler that decided it (an inner
// handler's replaces an outer's). One provider per request answers them.
type shownState struct {
	mu sync.Mutex // placeholders may be read from another goroutine (a log)
	shownValues
}

// shownValues are the placeholders' values; the zone's name and its
// policy's limit are values made once (string and int64, as ever).
type shownValues struct {
	zone, limit             any
	remaining, reset, retry int64
	exceeded                bool
}

// shown is what o shows in the placeholders.
func (o outcome) shown() shownValues {
	v := shownValues{zone: o.z.shown.name, limit: o.text.limitValue, remaining: o.d.Remaining, reset: o.d.ResetUnix(),
		retry: o.retry, exceeded: !o.d.Allowed}
	if o.d.Limit != o.text.limit {
		v.limit = o.d.Limit
	}
	return v
}

// shownNames are the placeholders a shownState answers.
var shownNames = [...]string{"http.rate_limit.zone", "http.rate_limit.limit", "http.rate_limit.remaining",
	"http.rate_limit.reset", "http.rate_limit.exceeded", "http.rate_limit.retry_after"}

// placeholder answers {http.rate_limit.zone}, limit, remaining, reset,
// exceeded and retry_after; other keys are not its own.
func (st *shownState) placeholder(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, "http.rate_limit.")
	if !ok {
		return nil, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	switch name {
	case "zone":
		return st.zone, true
	case "limit":
		return st.limit, true
	case "remaining":
		return st.remaining, true
	case "reset":
		return st.reset, true
	case "exceeded":
		return st.exceeded, true
	case "retry_after":
		return st.retry, true
	}
	return nil, false
}

// setLimitHeaders sets the headers that the Headers option chooses: what
// the policy fixes as written once (policyText), the numbers of the
// decision written together into one string.
func (h *Handler) setLimitHeaders(f *headerFields, o outcome) {
	x := h.Headers == "" || h.Headers == "x_ratelimit" || h.Headers == "both"
	ietf := h.Headers == "ietf" || h.Headers == "both"
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
	if ietf && p.Algorithm != limiter.Concurrency {
		// draft-ietf-httpapi-ratelimit-headers: the policy (quota per
		// window) and the state (remaining, seconds until reset). A
		// concurrency limit has no window: only its state is sent.
		if q := cmp.Or(o.d.Limit, p.Limit()); q == o.text.limit { // a zone not asked has no decision
			policy = o.text.quota
		} else {
			b = appendQuota(b, o.z.shown.quoted, q, quotaWindow(p, q))
		}
	}
	cut[2] = len(b)
	if ietf {
		reset := max(int64(math.Ceil(time.Until(o.d.Reset).Seconds())), 0)
		b = appendState(b, o.z.shown.quoted, o.d.Remaining, reset)
	}
	nums := string(b)
	if x {
		f.set(hdrLimit, o.text.limitField(o.d.Limit))
		f.set(hdrRemaining, nums[:cut[0]])
		f.set(hdrReset, nums[cut[0]:cut[1]])
	}
	if ietf {
		if p.Algorithm != limiter.Concurrency {
			f.set(hdrPolicy, cmp.Or(policy, nums[cut[1]:cut[2]]))
		}
		f.set(hdrState, nums[cut[2]:])
	}
}

// appendQuota appends RateLimit-Policy's value: "zone";q=<q>;w=<w>.
func appendQuota(b []byte, quoted string, q, w int64) []byte {
	b = append(append(b, quoted...), ";q="...)
	b = strconv.AppendInt(b, q, 10)
	return strconv.AppendInt(append(b, ";w="...), w, 10)
}

// appendState appends RateLimit's value: "zone";r=<r>;t=<t>.
func appendState(b []byte, quoted string, r, t int64) []byte {
	b = append(append(b, quoted...), ";r="...)
	b = strconv.AppendInt(b, r, 10)
	return strconv.AppendInt(append(b, ";t="...), t, 10)
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

// refuse answers 429 as the Response option says: the body is the
// policy's start (policyText), the wait, the zone's end, written into a
// pooled buffer.
func (h *Handler) refuse(w http.ResponseWriter, f *headerFields, o outcome) error {
	if h.Response == "handle_errors" {
		f.set(hdrRetryAfter, strconv.FormatInt(o.retry, 10))
		return caddyhttp.Error(http.StatusTooManyRequests, o.z.shown.exceeded)
	}
	head, contentType := o.text.json, "application/json"
	if h.Response == "problem" {
		head, contentType = o.text.problem, "application/problem+json"
	}
	buf := bodies.Get().(*[]byte)
	body := appendSeconds(append((*buf)[:0], head...), o.retry)
	body = append(strconv.AppendInt(append(body, o.z.shown.bodyEnd...), o.retry, 10), "}\n"...)
	var room [40]byte
	nums := strconv.AppendInt(room[:0], o.retry, 10)
	cut := len(nums)
	s := string(strconv.AppendInt(nums, int64(len(body)), 10))
	f.set(hdrRetryAfter, s[:cut])
	f.set(hdrContentType, contentType)
	f.set(hdrContentLength, s[cut:])
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body) // a client that left needs no answer
	*buf = body
	bodies.Put(buf)
	return nil
}

// bodies are the buffers 429 bodies are written into (Write does not keep
// what it is given).
var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// appendSeconds appends n seconds in words: "1 second", "<n> seconds".
func appendSeconds(b []byte, n int64) []byte {
	if n == 1 {
		return append(b, "1 second"...)
	}
	return append(strconv.AppendInt(b, n, 10), " seconds"...)
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

// zoneShown is what a zone's responses show that does not change from one
// request to the next, written once.
type zoneShown struct {
	name     any    // the zone's name, for {http.rate_limit.zone}
	quoted   string // the name as a quoted string, for the IETF fields
	bodyEnd  string // the 429 bodies after the wait: .","zone":"<name>","retry_after":
	exceeded error  // handle_errors' error
	static   *policyText
	// others are the texts of policies from placeholders, at most
	// maxPolicyTexts; the map is replaced, never changed.
	others atomic.Pointer[map[limiter.Policy]*policyText]
}

// maxPolicyTexts bounds the policies from placeholders whose texts a zone
// keeps; the others are written per request.
const maxPolicyTexts = 64

// init writes what the responses of zone name show, and the texts of its
// static policy (or default one).
func (s *zoneShown) init(name string, static limiter.Policy) {
	s.name, s.quoted = name, strconv.Quote(name) // fmt's %q
	zone, _ := json.Marshal(name)
	s.bodyEnd = `.","zone":` + string(zone) + `,"retry_after":`
	s.exceeded = fmt.Errorf("rate limit exceeded in zone %q", name)
	s.static = newPolicyText(s.quoted, static)
}

// text is policy p's text in the zone.
func (s *zoneShown) text(p limiter.Policy) *policyText {
	if p == s.static.policy {
		return s.static
	}
	others := s.others.Load()
	if others != nil {
		if t, ok := (*others)[p]; ok {
			return t
		}
	}
	t := newPolicyText(s.quoted, p)
	if others == nil || len(*others) < maxPolicyTexts {
		m := map[limiter.Policy]*policyText{p: t}
		if others != nil {
			maps.Copy(m, *others)
		}
		s.others.CompareAndSwap(others, &m) // or another request's map stays
	}
	return t
}

// policyText is what responses show that a zone's policy fixes, written
// once: its limit, RateLimit-Policy, and the 429 bodies up to the wait.
type policyText struct {
	policy     limiter.Policy
	limit      int64  // policy.Limit()
	limitValue any    // limit, for {http.rate_limit.limit}
	limitText  string // limit, for X-RateLimit-Limit
	quota      string // RateLimit-Policy for limit; "" for a concurrency limit
	// json and problem are the bodies (as json.Marshal writes them) up to
	// the wait in the message, whose string goes on.
	json, problem []byte
}

func newPolicyText(quoted string, p limiter.Policy) *policyText {
	msg, _ := json.Marshal("You have exceeded the rate limit of " + p.String() + ". Try again in ")
	msg = msg[:len(msg)-1] // the string goes on
	t := &policyText{policy: p, limit: p.Limit(), limitText: strconv.FormatInt(p.Limit(), 10),
		json:    append([]byte(`{"error":"rate limit exceeded","message":`), msg...),
		problem: append([]byte(`{"type":"about:blank","title":"Too Many Requests","status":429,"detail":`), msg...)}
	t.limitValue = t.limit
	if p.Algorithm != limiter.Concurrency {
		t.quota = string(appendQuota(nil, quoted, t.limit, quotaWindow(p, t.limit)))
	}
	return t
}

// limitField is X-RateLimit-Limit for a decision's limit n.
func (t *policyText) limitField(n int64) string {
	if n == t.limit {
		return t.limitText
	}
	return strconv.FormatInt(n, 10)
}

// wait sleeps for d, or until the client goes away.
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
