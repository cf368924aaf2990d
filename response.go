package ratelimit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

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

// respond answers a request as its verdict says: on_store_error's refusal
// or pass; else the most restrictive decision sets the placeholders and
// headers, and refuses the request or lets it go on to next (after a
// leaky bucket's wait), giving back its concurrency slots when next is done.
// shown is what dry-run zones show in the headers, or nil.
func (h *Handler) respond(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, repl *caddy.Replacer, v verdict, shown *outcome) error {
	switch {
	case v.err != nil: // Redis failed, on_store_error deny
		w.Header().Set("Retry-After", strconv.FormatInt(int64(limiter.BreakerCooldown/time.Second), 10))
		return v.err
	case v.unlimited: // Redis failed, on_store_error allow
		return next.ServeHTTP(w, r)
	}
	i := mostRestrictive(v.decisions)
	o := h.outcome(v.zones[i].name, v.reqs[i], v.decisions[i])
	o.setPlaceholders(repl)
	if shown == nil || !o.d.Allowed || o.d.Remaining <= shown.d.Remaining {
		h.setLimitHeaders(w.Header(), o)
	}
	if !o.d.Allowed {
		h.logRefusal(o)
		h.refused(r, repl, o) // refusallog.go: placeholder, event, info log
		return h.refuse(w, o)
	}
	defer v.release.call()
	if err := wait(r.Context(), maxDelay(v.decisions)); err != nil {
		return caddyhttp.Error(499, fmt.Errorf("client left while its request waited its turn: %w", err))
	}
	if s := h.settlement(v, repl, shown); s != nil { // settle.go: count_status, cost_from_response
		return s.serve(w, r, next)
	}
	return next.ServeHTTP(w, r)
}

// outcome is what a request is told: the deciding zone's decision.
type outcome struct {
	zone  string
	req   limiter.Request
	d     limiter.Decision
	retry int64 // Retry-After, seconds, jitter included; 0 when allowed
}

func (h *Handler) outcome(zone string, req limiter.Request, d limiter.Decision) outcome {
	o := outcome{zone: zone, req: req, d: d}
	if !d.Allowed {
		o.d.RetryAfter = h.withJitter(d.RetryAfter) // Jitter: a fraction of the wait
		o.retry = o.d.RetryAfterSeconds()
		if j := time.Duration(h.RetryAfterJitter); j >= time.Second {
			o.retry += rand.Int64N(int64(j/time.Second) + 1) // math/rand/v2: safe for concurrent use
		}
	}
	return o
}

func (o outcome) setPlaceholders(repl *caddy.Replacer) {
	repl.Set("http.rate_limit.zone", o.zone)
	repl.Set("http.rate_limit.limit", o.d.Limit)
	repl.Set("http.rate_limit.remaining", o.d.Remaining)
	repl.Set("http.rate_limit.reset", o.d.ResetUnix())
	repl.Set("http.rate_limit.exceeded", !o.d.Allowed)
	repl.Set("http.rate_limit.retry_after", o.retry)
}

// setLimitHeaders sets the headers that the Headers option chooses.
func (h *Handler) setLimitHeaders(hdr http.Header, o outcome) {
	if h.Headers == "" || h.Headers == "x_ratelimit" || h.Headers == "both" {
		hdr.Set("X-RateLimit-Limit", strconv.FormatInt(o.d.Limit, 10))
		hdr.Set("X-RateLimit-Remaining", strconv.FormatInt(o.d.Remaining, 10))
		hdr.Set("X-RateLimit-Reset", strconv.FormatInt(o.d.ResetUnix(), 10))
	}
	if h.Headers == "ietf" || h.Headers == "both" {
		// draft-ietf-httpapi-ratelimit-headers: the policy (quota per
		// window) and the state (remaining, seconds until reset). A
		// concurrency limit has no window: only its state is sent.
		if p := o.req.Policy; p.Algorithm != limiter.Concurrency {
			q := cmp.Or(o.d.Limit, p.Limit()) // a zone not asked has no decision
			hdr.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", o.zone, q, quotaWindow(p, q)))
		}
		reset := max(int64(math.Ceil(time.Until(o.d.Reset).Seconds())), 0)
		hdr.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", o.zone, o.d.Remaining, reset))
	}
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

func (h *Handler) logRefusal(o outcome) {
	if ce := h.logger.Check(zap.DebugLevel, "rate limited"); ce != nil {
		fields := []zap.Field{zap.String("zone", o.zone), zap.Int64("retry_after", o.retry)}
		if h.LogKeys {
			fields = append(fields, zap.String("key", o.req.Key))
		}
		ce.Write(fields...)
	}
}

// refusal is the JSON body of a 429.
type refusal struct {
	Error      string `json:"error"`
	Message    string `json:"message"`
	Zone       string `json:"zone"`
	RetryAfter int64  `json:"retry_after"`
}

// problem is the RFC 9457 body of a 429, with the zone and the wait as
// extension members.
type problem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	Zone       string `json:"zone"`
	RetryAfter int64  `json:"retry_after"`
}

// refuse answers 429 as the Response option says.
func (h *Handler) refuse(w http.ResponseWriter, o outcome) error {
	w.Header().Set("Retry-After", strconv.FormatInt(o.retry, 10))
	message := fmt.Sprintf("You have exceeded the rate limit of %s. Try again in %s.", o.req.Policy, seconds(o.retry))
	var body any = refusal{Error: "rate limit exceeded", Message: message, Zone: o.zone, RetryAfter: o.retry}
	contentType := "application/json"
	switch h.Response {
	case "handle_errors":
		return caddyhttp.Error(http.StatusTooManyRequests, fmt.Errorf("rate limit exceeded in zone %q", o.zone))
	case "problem":
		contentType = "application/problem+json"
		body = problem{Type: "about:blank", Title: "Too Many Requests", Status: http.StatusTooManyRequests,
			Detail: message, Zone: o.zone, RetryAfter: o.retry}
	}
	data, err := json.Marshal(body)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)+1))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(append(data, '\n')) // a client that left needs no answer
	return nil
}

func seconds(n int64) string {
	if n == 1 {
		return "1 second"
	}
	return strconv.FormatInt(n, 10) + " seconds"
}

// mostRestrictive is the index of the decision the client is shown.
func mostRestrictive(decisions []limiter.Decision) int {
	best := 0
	for i, d := range decisions[1:] {
		if d.MoreRestrictive(decisions[best]) {
			best = i + 1
		}
	}
	return best
}

// maxDelay is the longest wait a leaky bucket asks of the request.
func maxDelay(decisions []limiter.Decision) time.Duration {
	var d time.Duration
	for _, x := range decisions {
		d = max(d, x.Delay)
	}
	return d
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
