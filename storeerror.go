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

// storeFailed applies on_store_error to a request that Redis did not decide.
func (h *Handler) storeFailed(reqs []limiter.Request, err error) verdict {
	if h.backend.failing.CompareAndSwap(false, true) {
		h.logger.Error("redis store failing; on_store_error applies until it answers again",
			zap.String("on_store_error", h.onError.Mode), zap.Error(err))
	} else {
		h.logger.Debug("redis store failed", zap.Error(err))
	}
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
	return verdict{decisions: h.backend.memory.TakeAt(h.now(), local), release: h.releaser(h.backend.memory, local), storeFailed: true}
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
