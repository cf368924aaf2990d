package ratelimit

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// BanConfig bans a zone's repeat offenders.
type BanConfig struct {
	// After is how many refusals ban a client.
	After int64 `json:"after,omitempty"`
	// Within is the window the refusals are counted in.
	Within caddy.Duration `json:"within,omitempty"`
	// For is how long a ban lasts.
	For caddy.Duration `json:"for,omitempty"`
}

// policy is b as the limiter's ban; a nil b bans nobody.
func (b *BanConfig) policy() (limiter.Ban, error) {
	if b == nil {
		return limiter.Ban{}, nil
	}
	ban := limiter.Ban{After: b.After, Within: time.Duration(b.Within), For: time.Duration(b.For)}
	if b.After < 1 {
		return ban, fmt.Errorf("ban: after %d: want at least 1 refusal", b.After)
	}
	return ban, ban.Validate()
}

// banStore is the store that keeps the bans of reqs: Redis while the
// breakers of their nodes are closed (bans are shared by the fleet), else
// this instance's memory.
func (h *Handler) banStore(ctx context.Context, reqs []limiter.Request) limiter.Store {
	if b := h.backend; b.redis != nil && b.redis.Available(ctx, reqs) {
		return b.redis
	}
	return h.backend.memory
}

// banned looks up the bans of the zones that ban (skipping clients the
// cache of refused clients already refuses). When the client is banned,
// the verdict holds the refusal of the longest ban and zero decisions (not
// asked) for the other zones.
func (h *Handler) banned(ctx context.Context, reqs []limiter.Request) (verdict, bool) {
	var look []limiter.Request
	var at []int
	var now time.Time // read for the first zone that bans
	for i, r := range reqs {
		if r.Policy.Ban.After == 0 {
			continue
		}
		if now.IsZero() {
			now = h.now()
		}
		if c := h.backend.refused; c != nil {
			if _, hit := c.Get(r, now); hit {
				continue // decided from the cache by take, without Redis
			}
		}
		look, at = append(look, r), append(at, i)
	}
	if len(look) == 0 {
		return verdict{}, false
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(h.timeout, time.Second))
	left, err := h.banStore(tctx, look).Banned(tctx, look)
	cancel()
	if err != nil {
		h.logger.Debug("looking up bans", zap.Error(err))
		return verdict{}, false
	}
	best := -1
	for j, l := range left {
		if l > 0 && (best < 0 || l > left[best]) {
			best = j
		}
	}
	if best < 0 {
		return verdict{}, false
	}
	v := verdict{decisions: make([]limiter.Decision, len(reqs))}
	i := at[best]
	v.decisions[i] = h.banDecision(reqs[i], left[best], now)
	return v, true
}

// banDecision is the refusal of a banned client, remembered by the local
// cache so that its next requests are refused without Redis.
func (h *Handler) banDecision(r limiter.Request, left time.Duration, now time.Time) limiter.Decision {
	d := limiter.Decision{Limit: r.Policy.Limit(), Reset: now.Add(left), RetryAfter: left, Banned: true}
	if c := h.backend.refused; c != nil {
		c.PutBan(r, d, now)
	}
	return d
}

// countRefusals counts, for the zones that ban, the refusals among
// decisions, and turns a refusal that starts (or meets) a ban into the
// ban's refusal.
func (h *Handler) countRefusals(ctx context.Context, reqs []limiter.Request, decisions []limiter.Decision) {
	for i, d := range decisions {
		r := reqs[i]
		if d.Allowed || d.Limit == 0 || d.Banned || r.Policy.Ban.After == 0 {
			continue // a ban's refusal counts no more
		}
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(h.timeout, time.Second))
		left, started, err := h.banStore(tctx, reqs[i:i+1]).Refused(tctx, r)
		cancel()
		if err != nil {
			h.logger.Debug("counting a refusal for bans", zap.Error(err))
			continue
		}
		if started {
			metrics.bans.WithLabelValues(r.Zone).Inc()
			h.logger.Info("client banned", zap.String("zone", r.Zone), zap.Duration("for", left))
		}
		if left > d.RetryAfter {
			decisions[i] = h.banDecision(r, left, h.now())
		}
	}
}
