package ratelimit

import (
	"fmt"
	"net/http"

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

// fallback is p as the store's fallback.
func (p StoreErrorPolicy) fallback() limiter.Fallback {
	mode := map[string]limiter.FallbackMode{storeErrorLocal: limiter.FallbackLocal,
		storeErrorAllow: limiter.FallbackAllow, storeErrorDeny: limiter.FallbackDeny}[p.Mode]
	return limiter.Fallback{Mode: mode, Instances: p.Instances}
}
