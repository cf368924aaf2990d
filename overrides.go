package ratelimit

// Run-time overrides of the zones' limits (overrides.Overrides keeps them
// current, where the store keeps its buckets): what they do applied to a
// request (overrides.Set.Effect says what), and their first read and poll
// as a config loads. What is logged and counted when they change is in
// storeevents.go; the admin API that changes them in admin_overrides.go.

import (
	"cmp"
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// overridesStartTimeout bounds the first read of the overrides when a
// config loads: past it, the config serves with the overrides it has
// (none at first start) and reads them in the background.
const overridesStartTimeout = 3 * time.Second

// override applies to req, z's request, what the overrides in force of
// set do to it (overrides.Set.Effect: the zone's, then its key's). False
// when the key is exempt: z does not count the request. The key's digest
// is looked up only when some key of z has an override.
func (z *Zone) override(set *overrides.Set, req *limiter.Request, c *overrides.Clock, logger *zap.Logger) bool {
	var key *[16]byte
	if set.HasKeys(z.name) {
		d := req.Digest()
		key = &d
	}
	e := set.Effect(z.effectTarget(req.Policy), key, c)
	z.apply(&e, req, logger)
	return !e.Exempt
}

// apply gives req, z's request, what e says the overrides do to it,
// logging once per zone an override's limits left out; an exempt key's
// request keeps its policy.
func (z *Zone) apply(e *overrides.Effect, req *limiter.Request, logger *zap.Logger) {
	if e.LeftOut != nil {
		z.warnOverride(logger, e.LeftOut)
	}
	if e.DryRun != nil {
		req.DryRun = *e.DryRun
	}
	if !e.Exempt {
		req.Policy, req.Block = e.Policy, e.Block
	}
}

// effectTarget is z as its overrides see it, for a request whose
// policy under the config is p. Its check is the method value provision
// made (a method value made here is allocated at every request, since
// overrides.Set.Effect lets it escape); one of its own for a zone that
// was not provisioned.
func (z *Zone) effectTarget(p limiter.Policy) overrides.Target {
	check := z.checkOverridden
	if check == nil {
		check = z.takesOverridden
	}
	return overrides.Target{Zone: z.name, Policy: p, BurstSet: z.Burst != "", Check: check}
}

// takesOverridden reports whether z takes p, a policy under an override,
// besides p's own validity: the algorithm's bounds that the config's
// policy passes, and the sync's.
func (z *Zone) takesOverridden(p limiter.Policy) error {
	return cmp.Or(checkAlgorithmLimits(p), z.syncFits(p))
}

// warnOverride logs, once per zone, that an override was left out.
func (z *Zone) warnOverride(logger *zap.Logger, err error) {
	if z.warned[fieldOverride].CompareAndSwap(false, true) {
		logger.Warn("a run-time override does not fit this zone and is left out: the config's limit applies to what it would change; "+
			"see GET /rate_limit/overrides, and set it again or delete it (logged once per zone)",
			zap.String("zone", z.name), zap.Error(err))
	}
}

// provisionOverrides has the store read its overrides before h serves,
// and h's overrides_poll join those of the store's other handlers.
func (h *Handler) provisionOverrides() {
	h.store.holdPoll(h, time.Duration(h.OverridesPoll))
	ctx, cancel := context.WithTimeout(context.Background(), overridesStartTimeout)
	defer cancel()
	if err := h.store.overrides.Start(ctx); err != nil {
		h.logger.Warn("rate limit overrides not read as the config loads: those last read apply (none at first start) until they are",
			zap.String("store", string(h.store.Kind())), zap.Error(err))
	}
}

// holdPoll records the overrides_poll of h (0: none set; -1: h lets go of
// the store) and sets the store's poll to the shortest that the handlers
// holding it set, or else the default.
func (s *sharedLimiter) holdPoll(h *Handler, d time.Duration) {
	s.capacityMu.Lock()
	defer s.capacityMu.Unlock()
	switch {
	case d > 0:
		if s.polls == nil {
			s.polls = make(map[*Handler]time.Duration)
		}
		s.polls[h] = d
	default:
		delete(s.polls, h)
	}
	poll := time.Duration(0)
	for _, p := range s.polls {
		if poll == 0 || p < poll {
			poll = p
		}
	}
	poll = cmp.Or(poll, overrides.DefaultPoll)
	if poll != s.poll {
		s.poll = poll
		s.overrides.SetPoll(poll)
	}
}
