package fleetsync

import (
	"context"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Taken is what a Syncer's Take decided of a request's zones that sync:
// the decisions, the requests it left to the fleet, and what Undo gives
// back. Its zero value is ready; Take reuses its room from one take to
// the next, so that a caller that keeps one (as a limiter.Verdict does)
// decides without allocating.
type Taken struct {
	// Decisions are the decisions of the requests taken, in their order:
	// zero for one left to the fleet, and for one not asked when another
	// refused.
	Decisions []bucket.Decision
	// Exact lists the requests left to the fleet (their decisions are
	// zero): a bucket this instance has no entry of (its first request
	// reads Redis, which seeds the entry: see Seed), a cost over the share,
	// or no room for a new entry. Empty when Take refused.
	Exact []int

	s       *Syncer
	reqs    []bucket.Request
	es      []*syncEntry // the entries spent, by request (nil: none)
	allowed bool         // none refused: there is something to undo
	charged bool         // an in-process fleet was charged at once
}

// Allowed reports whether the take admitted every request it decided
// (those left to the fleet are to be decided there); false when one
// refused, and then nothing was taken.
func (t *Taken) Allowed() bool { return t.allowed }

// Undo gives back what the take admitted (another zone of the request
// refused); it does nothing when the take refused, or was undone.
func (t *Taken) Undo() {
	if !t.allowed {
		return
	}
	t.allowed = false
	t.s.giveBack(t.es, t.reqs, t.charged)
}

// Reset empties t for another take, keeping its room, and drops its
// references to the requests and entries of the last one.
func (t *Taken) Reset() {
	clear(t.es)
	*t = Taken{Decisions: t.Decisions[:0], Exact: t.Exact[:0], es: t.es[:0]}
}

// room makes t ready for a take of reqs by s: its decisions and entries
// zeroed, len(reqs) of each, in its room when it has enough.
func (t *Taken) room(s *Syncer, reqs []bucket.Request) {
	n := len(reqs)
	if cap(t.Decisions) < n {
		t.Decisions = make([]bucket.Decision, n)
	}
	if cap(t.es) < n {
		t.es = make([]*syncEntry, n)
	}
	t.Decisions, t.es, t.Exact = t.Decisions[:n], t.es[:n], t.Exact[:0]
	clear(t.Decisions)
	clear(t.es)
	t.s, t.reqs, t.allowed, t.charged = s, reqs, false, false
}

// Take decides reqs (all of zones that sync) at now into t, all or
// nothing among those it decides, from the allowances; n is the least
// number of instances to share among. t keeps reqs until its Reset or its
// next take, for Undo.
func (s *Syncer) Take(now time.Time, reqs []bucket.Request, n int, t *Taken) {
	s.Start(reqs)
	s.floor.Store(int64(n))
	t.room(s, reqs)
	s.mu.Lock()
	defer s.mu.Unlock()
	allowed := true
	for i, r := range reqs {
		var how int
		t.es[i], t.Decisions[i], how = s.takeOne(now, r, n)
		switch how {
		case tookExact:
			t.Exact = append(t.Exact, i)
		case tookRefused:
			allowed = false
		}
	}
	if !allowed {
		s.refused(reqs, t)
		return
	}
	t.allowed, t.charged = true, s.spend(reqs, t.es)
	for _, i := range t.Exact { // the first requests of a bucket in flight: seed waits for the last
		if id := bucket.IDOf(reqs[i]); s.entries[id] == nil {
			if s.seeding[id] == nil {
				s.seeding[id] = &seeding{}
			}
			s.seeding[id].n++
		}
	}
}

// refused leaves t, a take of reqs that a request refused, as nothing
// taken: the refusal shows, the others are not asked, and none is left to
// the fleet. The caller holds mu.
func (s *Syncer) refused(reqs []bucket.Request, t *Taken) {
	for i := range t.Decisions { // none charged
		if t.Decisions[i].Allowed {
			t.Decisions[i] = bucket.Decision{}
		}
	}
	for _, i := range t.Exact { // not sent: no answer to wait for
		if e := s.entries[bucket.IDOf(reqs[i])]; e != nil {
			e.confirming = time.Time{}
		}
	}
	t.Exact = t.Exact[:0]
	clear(t.es)
}

// spend takes what reqs cost from their entries es (nil: none), charging
// an in-process fleet at once; it reports whether it did (else the rounds
// charge it). The caller holds mu.
func (s *Syncer) spend(reqs []bucket.Request, es []*syncEntry) bool {
	_, inProcess := s.fleet.(inProcessFleet)
	charged := inProcess && s.chargeNow(reqs, es)
	for i, e := range es {
		if e == nil {
			continue
		}
		cost := bucket.BoundedCost(reqs[i].Cost)
		e.allowance = max(e.allowance-cost, 0)
		if !charged { // charged at a round
			e.spent = min(e.spent+cost, bucket.MaxCost)
			if 2*e.spent >= e.granted {
				s.flag(e)
			}
		}
	}
	return charged
}

// chargeNow charges an in-process fleet what the take of reqs admitted
// (the entries es), as it is admitted: its window is the one it counts in,
// and the others see it at this instance's next write. False when the fleet
// failed (charged nothing: the rounds charge it).
func (s *Syncer) chargeNow(reqs []bucket.Request, es []*syncEntry) bool {
	var charge []bucket.Request
	for i, e := range es {
		if e != nil {
			r := reqs[i]
			r.Key, r.ID = "", ""
			charge = append(charge, r)
		}
	}
	_, err := s.fleet.ChargeAll(context.Background(), charge)
	s.failing.Store(err != nil)
	return err == nil
}

// giveBack undoes a take whose request another zone refused; charged:
// the take charged an in-process fleet at once.
func (s *Syncer) giveBack(es []*syncEntry, reqs []bucket.Request, charged bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var give []bucket.Request
	for i, e := range es {
		if e == nil {
			continue
		}
		cost := bucket.BoundedCost(reqs[i].Cost)
		e.allowance += cost
		if charged {
			give = append(give, reqs[i])
			continue
		}
		e.spent = max(e.spent-cost, e.sending)
	}
	if len(give) > 0 {
		s.fleet.(inProcessFleet).give(give)
	}
}
