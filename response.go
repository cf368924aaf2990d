package ratelimit

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
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
	i := shown(v)
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
		return h.refuse(w, r, &f, o, zones, v)
	}
	if err := wait(r.Context(), v.MaxDelay()); err != nil {
		return caddyhttp.Error(499, fmt.Errorf("client left while its request waited its turn: %w", err))
	}
	if s := h.settlement(zones, v, repl, dry); s != nil { // responsecount.go: count_status, cost_from_response
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
	retry int64 // Retry-After, seconds, jitter included; 0 when allowed, or when it never passes
	// banned is a refusal of a banned (or blocked) client; impossible one
	// of a request whose cost exceeds the limit, which no wait lets pass.
	banned, impossible bool
	// z is the zone, and text what its responses show for req's policy.
	z    *Zone
	text *policyText
}

func (h *Handler) outcome(z *Zone, req limiter.Request, d limiter.Decision) outcome {
	o := outcome{zone: z.name, req: req, d: d, z: z, text: z.shown.text(req.Policy)}
	if d.Allowed {
		return o
	}
	o.banned = d.Banned
	if o.impossible = !d.Banned && neverPasses(req); o.impossible {
		return o
	}
	o.d.RetryAfter = h.withJitter(d.RetryAfter) // Jitter: a fraction of the wait
	o.retry = o.d.RetryAfterSeconds()
	if j := time.Duration(h.RetryAfterJitter); j >= time.Second {
		o.retry += rand.Int64N(int64(j/time.Second) + 1) // math/rand/v2: safe for concurrent use
	}
	return o
}

// neverPasses reports whether req costs more than its policy's limit: a
// bucket that is full still refuses it.
func neverPasses(req limiter.Request) bool {
	return req.Policy.Algorithm != limiter.Concurrency && req.Cost > req.Policy.Limit()
}

// shown is the index of the enforced zone whose decision a request is
// shown (limiter.Verdict.Shown), or of a zone that refuses it whatever it
// waits, rather than another's refusal with a wait that it cannot keep.
func shown(v *limiter.Verdict) int {
	i := v.Shown(false)
	if i < 0 || v.Decisions[i].Allowed || v.Decisions[i].Banned || neverPasses(v.Requests[i]) {
		return i
	}
	for j, s := range v.States {
		if s == limiter.Refused && !v.Requests[j].DryRun && neverPasses(v.Requests[j]) {
			return j
		}
	}
	return i
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
// policy's limit are values made once (string and int64, as ever), the
// name kept by the zone (a pointer: a shownState fits 64 bytes).
type shownValues struct {
	zone                    *any
	limit                   any
	remaining, reset, retry int64
	exceeded                bool
}

// shown is what o shows in the placeholders.
func (o outcome) shown() shownValues {
	v := shownValues{zone: &o.z.shown.name, limit: o.text.limitValue, remaining: o.d.Remaining, reset: o.d.ResetUnix(),
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
		if st.zone == nil {
			return nil, true
		}
		return *st.zone, true
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
