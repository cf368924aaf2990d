package ratelimit

import (
	"crypto/rand"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// A request's first step: identify, in a scratch reused from one request
// to the next, the zones that apply to it and the store request of each
// (the client's bucket, and the policy and cost for this request, under
// the overrides in force).

// scratch is where a request's zones, store requests and verdict are
// kept, reused from one request to the next (scratches).
type scratch struct {
	reqs    []limiter.Request
	zones   []*Zone
	verdict limiter.Verdict
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// recycle gives s back for another request, emptied: the store keeps
// copies of what it keeps past the request (slots to release or renew).
func (h *Handler) recycle(s *scratch) {
	clear(s.reqs)
	clear(s.zones)
	s.reqs, s.zones = s.reqs[:0], s.zones[:0]
	s.verdict.Reset()
	scratches.Put(s)
}

// identify builds, in s, one store request per zone that applies to r:
// the client's bucket in the zone, and the policy and cost for r under
// the overrides in force (Zone.override).
func (h *Handler) identify(r *http.Request, repl *caddy.Replacer, s *scratch) ([]limiter.Request, []*Zone, error) {
	if h.verifier != nil {
		h.useClaims(r, repl)
	}
	reqs, zones := s.reqs[:0], s.zones[:0]
	var id string
	set, clock := h.store.overrides.Current(), overrides.Clock{Now: h.now}
	for _, z := range h.zones {
		if set != nil && set.Disabled(z.name, &clock) {
			continue
		}
		req, ok, err := z.request(r, repl, h.logger)
		if err != nil {
			s.reqs, s.zones = reqs, zones // for recycle
			return nil, nil, err
		}
		req.DryRun = h.DryRun || z.DryRun
		if !ok || set != nil && !z.override(set, &req, &clock, h.logger) {
			continue
		}
		if a := req.Policy.Algorithm; a == limiter.Concurrency || a == limiter.SlidingWindowLog {
			if id == "" {
				id = rand.Text() // names this request's slot or log entries
			}
			req.ID = id
		}
		reqs, zones = append(reqs, req), append(zones, z)
	}
	s.reqs, s.zones = reqs, zones
	return reqs, zones, nil
}
