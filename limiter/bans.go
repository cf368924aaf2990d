package limiter

import (
	"context"
	"time"
)

// banStore is the store that keeps the bans of reqs: Redis while the
// breakers of their nodes are closed (bans are shared by the fleet), else
// this process's memory.
func (l *Limiter) banStore(ctx context.Context, reqs []Request) Store {
	if l.redis != nil && l.redis.Available(ctx, reqs) {
		return l.redis
	}
	return l.memory
}

// banned looks up the bans of the zones that ban (skipping clients the
// cache of refused clients already refuses). When the client is banned,
// the decisions hold the refusal of the longest ban, and zero decisions
// (not asked) for the other zones.
func (l *Limiter) banned(ctx context.Context, now time.Time, reqs []Request, ev Events) ([]Decision, bool) {
	var look []Request
	var at []int
	for i, r := range reqs {
		if r.Policy.Ban.After == 0 {
			continue
		}
		if now.IsZero() {
			now = time.Now()
		}
		if l.refused != nil {
			if _, hit := l.refused.Get(r, now); hit {
				continue // decided from the cache by take, without Redis
			}
		}
		look, at = append(look, r), append(at, i)
	}
	if len(look) == 0 {
		return nil, false
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	left, err := l.banStore(tctx, look).Banned(tctx, look)
	cancel()
	if err != nil {
		ev.Debug("looking up bans", err)
		return nil, false
	}
	best := -1
	for j, b := range left {
		if b > 0 && (best < 0 || b > left[best]) {
			best = j
		}
	}
	if best < 0 {
		return nil, false
	}
	decisions := make([]Decision, len(reqs))
	i := at[best]
	decisions[i] = l.banDecision(reqs[i], left[best], now)
	return decisions, true
}

// banDecision is the refusal of a banned client, remembered by the cache
// of refused clients so that its next requests are refused without Redis.
func (l *Limiter) banDecision(r Request, left time.Duration, now time.Time) Decision {
	d := Decision{Limit: r.Policy.Limit(), Reset: now.Add(left), RetryAfter: left, Banned: true}
	if l.refused != nil {
		l.refused.PutBan(r, d, now)
	}
	return d
}

// countRefusals counts, for the zones that ban, the refusals among
// decisions, and turns a refusal that starts (or meets) a ban into the
// ban's refusal; one that starts a ban is in state BanStarted.
func (l *Limiter) countRefusals(ctx context.Context, now time.Time, reqs []Request, decisions []Decision, states []State, ev Events) {
	for i, d := range decisions {
		r := reqs[i]
		if states[i] != Refused || r.Policy.Ban.After == 0 {
			continue // a ban's refusal counts no more
		}
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
		left, started, err := l.banStore(tctx, reqs[i:i+1]).Refused(tctx, r)
		cancel()
		if err != nil {
			ev.Debug("counting a refusal for bans", err)
			continue
		}
		if started {
			states[i] = BanStarted
			ev.BanStarted(r.Zone, left)
			if r.Global && l.regions != nil {
				l.regions.Banned(r, left)
			}
		}
		if left > d.RetryAfter {
			if now.IsZero() {
				now = time.Now()
			}
			decisions[i] = l.banDecision(r, left, now)
		}
	}
}

// BanLeft is how long req's client stays banned by its zone (0: it is
// not), as the store that decides the client holds the ban.
func (l *Limiter) BanLeft(ctx context.Context, req Request) (time.Duration, error) {
	if req.Policy.Ban.After == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	reqs := []Request{req}
	left, err := l.banStore(ctx, reqs).Banned(ctx, reqs)
	if err != nil {
		return 0, err
	}
	return left[0], nil
}
