package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
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

// fallback is p as the store's fallback.
func (p StoreErrorPolicy) fallback() limiter.Fallback {
	mode := map[string]limiter.FallbackMode{storeErrorLocal: limiter.FallbackLocal,
		storeErrorAllow: limiter.FallbackAllow, storeErrorDeny: limiter.FallbackDeny}[p.Mode]
	return limiter.Fallback{Mode: mode, Instances: p.Instances}
}

// deny answers a request that on_store_error deny refuses, as a 429 is
// answered: its status, Retry-After (the breaker's cooldown) and a body
// in the Response option's form, or a Caddy error for handle_errors. It
// is logged at most once per denyLogEvery, without the request: an
// outage must not write every client's headers into the error log.
func (h *Handler) deny(w http.ResponseWriter, err error) error {
	retry := int64(limiter.BreakerCooldown / time.Second)
	if now, last := h.now().UnixNano(), h.denyLogged.Load(); now-last >= int64(denyLogEvery) && h.denyLogged.CompareAndSwap(last, now) {
		h.logger.Warn("rate limit store failing: on_store_error deny refuses requests (logged at most every 10s)",
			zap.Int("status", h.onError.Status), zap.Error(err))
	}
	w.Header().Set(hdrRetryAfter, strconv.FormatInt(retry, 10))
	if h.Response == "handle_errors" {
		return caddyhttp.Error(h.onError.Status, errStoreDenied)
	}
	msg := fmt.Sprintf("The rate limit store is unavailable. Try again in %s.", appendSeconds(nil, retry))
	var body []byte
	contentType := "application/json"
	if h.Response == "problem" {
		contentType = "application/problem+json"
		body, _ = json.Marshal(map[string]any{"type": "about:blank", "title": http.StatusText(h.onError.Status),
			"status": h.onError.Status, "detail": msg})
	} else {
		body, _ = json.Marshal(map[string]any{"error": "rate limit store unavailable", "message": msg, "retry_after": retry})
	}
	body = append(body, '\n')
	w.Header().Set(hdrContentType, contentType)
	w.Header().Set(hdrContentLength, strconv.Itoa(len(body)))
	w.WriteHeader(h.onError.Status)
	_, _ = w.Write(body) // a client that left needs no answer
	return nil
}

// errStoreDenied is the error handle_errors gets for a request that
// on_store_error deny refused ({http.error.message}).
var errStoreDenied = errors.New("rate limit store unavailable: on_store_error deny")

// denyLogEvery throttles the log of on_store_error deny's refusals.
const denyLogEvery = 10 * time.Second
