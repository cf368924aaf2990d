package ratelimit

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Counting what the response says (count_status, cost_from_response): a
// zone that settles checks and charges a request before it goes on, as
// any zone does (so parallel requests cannot slip through), and settles
// the charge when the response's headers are written: the charge is
// given back when the status does not count, or brought to the cost the
// response's header says (more: charged, into debt if need be; less:
// given back). The store's Refund undoes the request's own charge and
// nothing newer; its Charge may put a token or leaky bucket into debt.

// settles reports whether z settles its charges after the response.
func (z *Zone) settles() bool { return len(z.CountStatus) > 0 || z.CostFromResponse != "" }

// checkSettle checks count_status and cost_from_response against the
// zone's algorithm.
func (z *Zone) checkSettle() error {
	for _, c := range z.CountStatus {
		if (c < 1 || c > 5) && (c < 100 || c > 599) {
			return about(fmt.Errorf("count_status %d: want a status from 100 to 599, or a class from 1 to 5 (4 for 4xx)", c), "count_status")
		}
	}
	switch {
	case z.StripCostHeader && z.CostFromResponse == "":
		return about(fmt.Errorf("strip_cost_header needs cost_from_response"), "cost_from_response")
	case z.CostFromResponse == "":
		return nil
	case strings.ContainsAny(z.CostFromResponse, " \t:{}"):
		return about(fmt.Errorf("cost_from_response %q: want a header name", z.CostFromResponse), "cost_from_response")
	case !z.policy.Algorithm.Debt():
		return about(fmt.Errorf("cost_from_response charges after the response, into debt if need be: "+
			"it needs token_bucket or leaky_bucket, not %s", z.policy.Algorithm), "cost_from_response", "algorithm")
	}
	return nil
}

// settledCost is what a request charged reserved costs after all, by
// its response's status and headers: 0 when the status does not count
// (a request whose client went away always counts); the cost header's
// amount, bounded (reserved when it is missing or malformed: logged once
// per zone); else reserved.
func (z *Zone) settledCost(status int, hdr http.Header, reserved int64, logger *zap.Logger) int64 {
	counts := func(c int) bool { return caddyhttp.StatusCodeMatches(status, c) }
	if status == statusClientClosed { // the work may be done: the client cannot undo its charge
		return z.costFromHeader(hdr, reserved, logger)
	}
	if len(z.CountStatus) > 0 && !slices.ContainsFunc(z.CountStatus, counts) {
		return 0
	}
	return z.costFromHeader(hdr, reserved, logger)
}

// statusClientClosed is the status Caddy gives a request whose client
// went away (reverse_proxy's 499).
const statusClientClosed = 499

// costFromHeader is the cost the response's cost header says, bounded,
// or reserved without cost_from_response, or when the header is missing
// or malformed (logged once per zone).
func (z *Zone) costFromHeader(hdr http.Header, reserved int64, logger *zap.Logger) int64 {
	if z.CostFromResponse == "" {
		return reserved
	}
	v := strings.TrimSpace(hdr.Get(z.CostFromResponse))
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && n > 0:
		return bucket.MaxCost
	case err != nil || n < 0:
		if z.warned[fieldResponseCost].CompareAndSwap(false, true) {
			logger.Warn("response cost header missing or not a whole number; charging the zone's cost (logged once)",
				zap.String("zone", z.name), zap.String("header", z.CostFromResponse), zap.String("value", v))
		}
		return reserved
	}
	return min(n, bucket.MaxCost)
}

// settlement settles the charges of one allowed request's zones that
// settle, once, when its response's headers are written (or its handler
// returns without writing them).
type settlement struct {
	h     *Handler
	zones []*Zone
	v     limiter.Verdict // the request's, its decisions copied: settled zones' are replaced
	idx   []int           // the zones that settle
	repl  *caddy.Replacer
	r     *http.Request // the request, for its placeholders (set by serve)
	dry   *outcome      // what dry-run zones show in the headers, or nil
	done  bool
}

// settlement is the settlement of v's enforced zones that settle; nil
// when none do, or when on_store_error decided (then every request counts,
// at its cost).
func (h *Handler) settlement(zones []*Zone, v *limiter.Verdict, repl *caddy.Replacer, dry *outcome) *settlement {
	if v.Calls[0].Failure != limiter.NoFailure {
		return nil
	}
	var idx []int
	for i, z := range zones {
		if z.settles() && v.States[i] == limiter.Allowed && !v.Requests[i].DryRun {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	s := &settlement{h: h, zones: zones, v: *v, idx: idx, repl: repl, dry: dry}
	s.v.Decisions = slices.Clone(v.Decisions)
	return s
}

// serve runs next with a response writer that settles when the headers
// are written; if next returns without writing them, the status is its
// error's (as Caddy answers it: a HandlerError's status, else 500), or
// 200.
func (s *settlement) serve(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	s.r = r
	sw := &settleWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, s: s}
	err := next.ServeHTTP(sw, r)
	if !s.done {
		status := statusOf(err)
		if r.Context().Err() != nil { // the client went away, whatever the error says
			status = statusClientClosed
		}
		s.settle(status, w.Header())
	}
	return err
}

// statusOf is the status Caddy answers a handler's error with.
func statusOf(err error) int {
	var he caddyhttp.HandlerError
	switch {
	case err == nil:
		return http.StatusOK
	case errors.As(err, &he) && he.StatusCode != 0:
		return he.StatusCode
	}
	return http.StatusInternalServerError
}

// settle gives back or charges the difference between what each zone
// charged and what the response says the request costs, strips the cost
// headers asked to be, and sets the limit headers and placeholders from
// the settled state.
func (s *settlement) settle(status int, hdr http.Header) {
	s.done = true
	var refund, charge []limiter.Request
	var taken []limiter.Decision // of the refunds' takes
	var refundIdx, chargeIdx []int
	for _, i := range s.idx {
		r := s.v.Requests[i]
		cost := s.zones[i].settledCost(status, hdr, r.Cost, s.h.logger)
		switch {
		case cost < r.Cost:
			r.Cost -= cost
			refund, taken, refundIdx = append(refund, r), append(taken, s.v.Decisions[i]), append(refundIdx, i)
		case cost > r.Cost:
			r.Cost = cost - r.Cost
			charge, chargeIdx = append(charge, r), append(chargeIdx, i)
		}
	}
	for _, i := range s.idx {
		if z := s.zones[i]; z.StripCostHeader {
			hdr.Del(z.CostFromResponse)
		}
	}
	if len(refund)+len(charge) > 0 {
		refunded, charged, refundErr, chargeErr := s.h.store.Settle(refund, taken, charge)
		s.apply("refund", refundIdx, refunded, refundErr)
		s.apply("charge", chargeIdx, charged, chargeErr)
	}
	if len(refund)+len(charge) > 0 {
		i := s.v.Shown(false)
		s.h.show(s.r, hdr, s.repl, s.h.outcome(s.zones[i], s.v.Requests[i], s.v.Decisions[i]), s.dry)
	}
}

// apply takes the decisions of a refund or charge of the zones idx.
func (s *settlement) apply(what string, idx []int, d []limiter.Decision, err error) {
	if err != nil {
		metrics.storeErrors.WithLabelValues(string(s.h.store.Kind())).Inc()
		s.h.logger.Debug("settling charges after the response failed", zap.String("op", what), zap.Error(err))
	}
	for j, i := range idx {
		if j < len(d) && d[j].Limit != 0 { // answered
			s.v.Decisions[i] = d[j]
		}
	}
}

// settleWriter settles the request's charges when its final status is
// written: before the headers leave, so that they show the settled state
// and the client cannot send its next request before the settlement.
type settleWriter struct {
	*caddyhttp.ResponseWriterWrapper
	s *settlement
}

// WriteHeader settles on the first final status (1xx are informational,
// but for 101 Switching Protocols), then writes it.
func (w *settleWriter) WriteHeader(status int) {
	if !w.s.done && (status >= 200 || status == http.StatusSwitchingProtocols) {
		w.s.settle(status, w.Header())
	}
	w.ResponseWriterWrapper.WriteHeader(status)
}

// Write writes the status 200 first when no final status was written.
func (w *settleWriter) Write(p []byte) (int, error) {
	if !w.s.done {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriterWrapper.Write(p)
}

// ReadFrom writes the status 200 first when no final status was written.
func (w *settleWriter) ReadFrom(r io.Reader) (int64, error) {
	if !w.s.done {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}
