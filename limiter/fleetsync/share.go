package fleetsync

import (
	"context"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// read makes the entry of r's bucket from a reading of an in-process fleet
// (nothing charged), or gives old, its entry, a new allowance from one;
// false past maxSyncEntries, or when the fleet cannot tell. The caller
// holds mu.
func (s *Syncer) read(now time.Time, r bucket.Request, n int, old *syncEntry) (*syncEntry, bool) {
	if old == nil && len(s.entries) >= maxSyncEntries {
		return nil, false
	}
	gen := s.fleet.(inProcessFleet).generation()
	if count, err := s.fleet.RegisterSync(context.Background(), s.id, InstancesWindow); err == nil { // counted in memory
		if old := s.n.Swap(max(count, 1)); old != max(count, 1) {
			if ev := s.ev.Load(); ev != nil {
				(*ev).InstancesChanged(int(max(count, 1)))
			}
		}
	}
	reading := r
	reading.Cost, reading.ID, reading.Key = 0, "", ""
	d, err := s.fleet.ChargeAll(context.Background(), []bucket.Request{reading})
	if err == nil && d[0].Limit == 0 {
		return nil, false
	}
	s.failing.Store(err != nil) // an in-process fleet tells at once
	e := old
	if e == nil {
		e = &syncEntry{req: reading, used: now}
		s.entries[bucket.IDOf(r)] = e
	}
	if err != nil { // the fleet cannot tell: the local share, and a reading at the next round
		e.wants = true
		s.flag(e)
		return e, true
	}
	e.synced, e.gen, e.turns = now, gen, windowTurns(now, r.Policy)
	a := max(share(held(r.Policy, d[0])+refill(r), s.instances(n))-e.spent, 0)
	e.allowance, e.granted, e.remaining, e.reset, e.full = a, a, d[0].Remaining, d[0].Reset, fullAt(now, d[0])
	return e, true
}

// fullAt is when the bucket d read at now is full again, on this
// instance's clock: d's Reset is on the fleet's (Redis's) clock, read at
// its At.
func fullAt(now time.Time, d bucket.Decision) time.Time {
	if d.At.IsZero() || d.Reset.IsZero() {
		return d.Reset
	}
	return now.Add(d.Reset.Sub(d.At))
}

// windowTurns is when the window of p that holds now ends (windows start
// at multiples of their length since the Unix epoch, a quota's periods at
// its calendar's); zero for the other algorithms.
func windowTurns(now time.Time, p bucket.Policy) time.Time {
	if p.Algorithm == bucket.Quota {
		_, end := p.Calendar.Bounds(now)
		return end
	}
	if p.Algorithm != bucket.FixedWindow && p.Algorithm != bucket.SlidingWindowCounter || p.Period <= 0 {
		return time.Time{}
	}
	ns, w := now.UnixNano(), int64(p.Period)
	return time.Unix(0, ns-ns%w+w)
}

// room is what e's bucket holds, as an in-process fleet counts it now,
// less what this instance admitted since its last round: a cost over the
// share is decided on it. The caller holds mu.
func (s *Syncer) room(e *syncEntry) int64 {
	return s.fleet.(inProcessFleet).Left(e.req) - e.spent
}

// seeding is a bucket whose first requests here are in Redis: n of them,
// best the answer read last in Redis (its latest At; of one At, a batched
// call's, the least remaining), which counts all the others' charges made
// before it.
type seeding struct {
	n    int
	best bucket.Decision
	req  bucket.Request
}

// update gives e r's policy: a policy changed (a reload, an override, a
// placeholder) caps the allowance at the new share and asks for a
// reading; a window's or a quota's count, read under the old limit,
// is then unknown (the new limit: a request the allowance lacks is
// decided in Redis, not refused on the old limit's reading). The caller
// holds mu.
func (s *Syncer) update(e *syncEntry, r bucket.Request, n int) {
	if e.req.Policy != r.Policy || e.req.Sync != r.Sync {
		e.allowance = min(e.allowance, share(r.Policy.Limit()+refill(r), s.instances(n)))
		if !r.Policy.Algorithm.Debt() && e.req.Policy != r.Policy {
			e.remaining = r.Policy.Limit()
		}
		e.wants = true
		s.flag(e)
	}
	r.Key = "" // only the digest is kept
	e.req = r
}

// Seed takes the exact decision d of r, a request take left to Redis (a
// zero d: not decided there). For a bucket's first requests here, the
// entry is made when the last of those in flight is answered, from the
// answer read last in Redis, which counts the others' charges before it:
// the bucket as Redis told it, and the share of it (nothing to charge).
// For a bucket that has an entry (a cost over the share), the allowance
// loses the cost Redis charged. No entry past maxSyncEntries.
func (s *Syncer) Seed(r bucket.Request, d bucket.Decision, now time.Time, n int) {
	if now.IsZero() {
		now = s.now()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := bucket.IDOf(r)
	if e, ok := s.entries[id]; ok {
		if d.Allowed { // owed (below zero) if the allowance is spent already
			e.allowance -= bucket.BoundedCost(r.Cost)
		}
		e.confirming = time.Time{}
		if d.Limit != 0 { // a reading: the bucket after this charge
			e.remaining, e.reset, e.full = d.Remaining, d.Reset, fullAt(now, d)
		}
		return
	}
	sd := s.seeding[id]
	if sd == nil {
		return
	}
	later := d.At.After(sd.best.At) || d.At.Equal(sd.best.At) && d.Remaining < sd.best.Remaining // one batched call: one time
	if d.Limit != 0 && !d.At.IsZero() && later {
		sd.best, sd.req = d, r
	}
	if sd.n--; sd.n > 0 {
		return
	}
	delete(s.seeding, id)
	if sd.best.Limit == 0 || len(s.entries) >= maxSyncEntries || !s.warm.Load() {
		return // none decided by Redis (a fallback), or the fleet not counted yet: the next request reads it
	}
	r, d = sd.req, sd.best
	r.Key = ""
	a := share(held(r.Policy, d)+refill(r), s.instances(n))
	s.entries[id] = &syncEntry{req: r, allowance: a, granted: a, remaining: d.Remaining, reset: d.Reset, full: fullAt(now, d), synced: now, used: now,
		turns: windowTurns(now, r.Policy)}
}

// localShare decides r by the instance's share of its limit while rounds
// fail (on_store_error local's policy), and adds to the allowance what it
// admits. The caller holds mu.
func (s *Syncer) localShare(now time.Time, e *syncEntry, r bucket.Request, n int) bool {
	p, err := bucket.InstanceShare(r.Policy, int(s.instances(n)))
	if err != nil {
		return false
	}
	r.Policy = p
	d := s.memory.TakeAt(now, []bucket.Request{r})
	if !d[0].Allowed {
		return false
	}
	e.allowance += bucket.BoundedCost(r.Cost)
	e.spent = max(min(e.spent, e.req.Policy.Limit()), e.sending) // charged once Redis answers: at most a burst
	return true
}
