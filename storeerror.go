package ratelimit

import (
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// StoreErrorPolicy says what a handler does while its Redis fails: while
// it does not answer within its timeout, refuses connections, or while the
// circuit breaker skips it after consecutive failures.
type StoreErrorPolicy struct {
	// Mode is one of:
	//   - "local" (the default): each Caddy instance enforces every zone on
	//     its own, in memory, with the rate and burst divided by Instances;
	//   - "allow": requests pass unlimited (fail open);
	//   - "deny": requests are refused with Status (fail closed).
	Mode string `json:"mode,omitempty"`

	// Status is the HTTP status of requests refused in deny mode.
	// Default: 503.
	Status int `json:"status,omitempty"`

	// Instances divides the rate and burst of every zone in local mode: the
	// number of Caddy instances sharing the limit. Default: 1.
	Instances int `json:"instances,omitempty"`
}

// The modes of StoreErrorPolicy.
const (
	storeErrorLocal = "local"
	storeErrorAllow = "allow"
	storeErrorDeny  = "deny"
)

var storeErrorModes = choices{storeErrorAllow, storeErrorDeny, storeErrorLocal}

// maxInstances bounds StoreErrorPolicy.Instances.
const maxInstances = 10000

// resolve returns p with its defaults, checked; p may be nil (not
// configured). withRedis says whether the handler has Redis, without which
// the policy does not apply.
func (p *StoreErrorPolicy) resolve(withRedis bool) (StoreErrorPolicy, error) {
	var r StoreErrorPolicy
	if p != nil {
		if !withRedis {
			return r, fmt.Errorf("on_store_error applies only with redis")
		}
		r = *p
	}
	if r.Mode == "" {
		r.Mode = storeErrorLocal
	}
	if r.Status == 0 {
		r.Status = http.StatusServiceUnavailable
	}
	if r.Instances == 0 {
		r.Instances = 1
	}
	switch {
	case !storeErrorModes.has(r.Mode):
		return r, fmt.Errorf("on_store_error: unknown mode %q (want %s)", r.Mode, storeErrorModes)
	case r.Status < 400 || r.Status > 599:
		return r, fmt.Errorf("on_store_error: status %d is not an error status (400-599)", r.Status)
	}
	if err := checkRange("instances", r.Instances, 1, maxInstances); err != nil {
		return r, fmt.Errorf("on_store_error: %w", err)
	}
	return r, nil
}

// storeFailed applies on_store_error to a request that Redis could not
// decide (unreachable, timed out, or a node's breaker open). Entering the
// failure mode is logged once, leaving it once (in takeRedis).
func (h *Handler) storeFailed(reqs []limiter.Request, err error) verdict {
	if h.backend.failing.CompareAndSwap(false, true) {
		h.logger.Error("redis store failing; on_store_error applies until it answers again",
			zap.String("on_store_error", h.onError.Mode), zap.Error(err))
	} else {
		h.logger.Debug("redis store failed", zap.Error(err))
	}
	return h.failureMode(reqs, err)
}

// scriptFailed applies on_store_error to a request whose script failed in
// a Redis that answered: an error caused by its data, which is its own
// problem and no sign that Redis is down (it counts toward no breaker). It
// is counted, and logged at error level at most once per scriptErrorLogEvery
// per Redis configuration (else at debug), since a client may cause it at will.
func (h *Handler) scriptFailed(reqs []limiter.Request, err error) verdict {
	metrics.scriptErrors.Inc()
	now := h.now()
	logged := &h.backend.scriptErrorLogged
	last := logged.Load()
	if now.UnixNano()-last >= int64(scriptErrorLogEvery) && logged.CompareAndSwap(last, now.UnixNano()) {
		h.logger.Error("rate limit script failed for a request; on_store_error applies to it alone (logged at most every 10s)",
			zap.String("on_store_error", h.onError.Mode), zap.Error(err))
	} else {
		h.logger.Debug("rate limit script failed for a request", zap.Error(err))
	}
	return h.failureMode(reqs, err)
}

// scriptErrorLogEvery throttles the error logs of failed scripts.
const scriptErrorLogEvery = 10 * time.Second

// failureMode decides reqs as on_store_error says.
func (h *Handler) failureMode(reqs []limiter.Request, err error) verdict {
	switch h.onError.Mode {
	case storeErrorAllow:
		return verdict{storeFailed: true, unlimited: true}
	case storeErrorDeny:
		return verdict{storeFailed: true, err: caddyhttp.Error(h.onError.Status, fmt.Errorf("rate limit store: %w", err))}
	}
	local := make([]limiter.Request, len(reqs))
	for i, r := range reqs {
		if p, err := localPolicy(r.Policy, h.onError.Instances); err == nil {
			r.Policy = p
		}
		local[i] = r
	}
	m := h.backend.memory
	d := m.TakeAt(h.now(), local)
	return verdict{decisions: d, release: h.holdSlots(m, local, d), storeFailed: true}
}

// localPolicy is a zone's share of its limit on one of n instances: the
// rate divided by n (windows keep their length, buckets refill n times
// slower), and the burst or the slots divided by n, at least 1.
func localPolicy(p limiter.Policy, n int) (limiter.Policy, error) {
	local := p
	switch {
	case p.Algorithm == limiter.Concurrency:
	case p.Algorithm.Windowed():
		local.Rate = max(p.Rate/int64(n), 1)
	case float64(p.Period)*float64(n) > float64(limiter.MaxPeriod):
		return p, fmt.Errorf("period %s times %d is longer than %s", p.Period, n, limiter.MaxPeriod)
	default:
		local.Period = p.Period * time.Duration(n)
	}
	local.Burst = max(p.Burst/int64(n), min(p.Burst, 1))
	if p.Algorithm.Windowed() {
		local.Burst = local.Rate
	}
	return local, local.Validate()
}
