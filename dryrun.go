package ratelimit

import (
	"context"

	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// dryRunResult is what the dry-run zones of a request leave for the rest
// of it.
type dryRunResult struct {
	// release gives back the dry-run concurrency slots, held like real
	// ones, so that a dry-run max_concurrent sees the requests in flight.
	release release
	// shown is what the dry-run zones show in the headers, with
	// DryRunHeaders; else nil.
	shown *outcome
}

// dryRun decides the dry-run zones of a request on their own, counting
// and logging what they would have done, and returns the other zones.
// reqs and zones are reordered in place.
func (h *Handler) dryRun(ctx context.Context, reqs []limiter.Request, zones []*Zone) ([]limiter.Request, []*Zone, dryRunResult) {
	var dry []limiter.Request
	var dryZones []*Zone
	n := 0
	for i, z := range zones {
		if h.DryRun || z.DryRun {
			dry, dryZones = append(dry, reqs[i]), append(dryZones, z)
			continue
		}
		reqs[n], zones[n] = reqs[i], z
		n++
	}
	if len(dry) == 0 {
		return reqs, zones, dryRunResult{}
	}
	v := h.take(ctx, dry)
	recordDecisions(dryZones, v, true)
	for i, d := range v.decisions {
		if !d.Allowed {
			h.logger.Debug("dry run: would be rate limited", zap.String("zone", dryZones[i].name),
				zap.Int64("retry_after", d.RetryAfterSeconds()))
		}
	}
	return reqs[:n], zones[:n], dryRunResult{release: v.release, shown: h.dryRunOutcome(dry, dryZones, v.decisions)}
}

// dryRunOutcome is what the dry-run zones would show in the headers, as an
// allowance, with DryRunHeaders; else nil.
func (h *Handler) dryRunOutcome(reqs []limiter.Request, zones []*Zone, decisions []limiter.Decision) *outcome {
	if !h.DryRunHeaders || len(decisions) == 0 {
		return nil
	}
	i := mostRestrictive(decisions)
	d := decisions[i]
	d.Allowed, d.RetryAfter = true, 0
	o := h.outcome(zones[i], reqs[i], d)
	return &o
}
