package fleetsync

import (
	"cmp"
	"context"
	"strconv"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Start starts the rounds, once, and makes them as frequent as the
// shortest interval of reqs.
func (s *Syncer) Start(reqs []bucket.Request) {
	for _, r := range reqs {
		s.atMost(r.Sync)
	}
	s.started.Do(func() { go s.run() })
}

// atMost makes the rounds at least as frequent as every d.
func (s *Syncer) atMost(d time.Duration) {
	for {
		cur := s.every.Load()
		if cur != 0 && cur <= int64(d) || s.every.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// Close stops the rounds, after a last one that charges what is left to
// charge. Safe to call more than once.
func (s *Syncer) Close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		started := true
		s.started.Do(func() { started = false; close(s.done) })
		if started {
			<-s.done
		}
	})
}

// run syncs every interval (the shortest of the buckets'), and registers
// the instance every registerEvery, until close; then a last round
// charges what is left.
func (s *Syncer) run() {
	defer close(s.done)
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	_ = s.register(ctx, s.now(), true)
	cancel()
	last := s.now()
	for {
		every := time.Duration(max(s.every.Load(), int64(time.Millisecond)))
		select {
		case <-s.stop:
			s.round(true)
			return
		case <-time.After(min(every, registerEvery, max(every-s.now().Sub(last), time.Millisecond))):
		}
		if now := s.now(); now.Sub(last) >= every {
			last = now
			s.round(false)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		_ = s.register(ctx, s.now(), false)
		cancel()
	}
}

// round syncs every bucket that is due (see due; all with something to
// charge when final), in batched charges of at most maxChargeBatch per
// node, each applied on its own: a part whose node failed keeps what it
// had to charge when it was certainly not sent, and counts it charged
// when it may have run (a charge is never sent twice).
func (s *Syncer) round(final bool) {
	now := s.now()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	_ = s.register(ctx, now, final)
	reqs, es := s.due(now, final)
	if len(reqs) == 0 {
		return
	}
	start := time.Now()
	var failed error
	for _, part := range s.fleet.Groups(ctx, reqs) {
		d, err := s.fleet.ChargeAll(ctx, bucket.Pick(reqs, part))
		failed = cmp.Or(failed, err)
		s.applyPart(now, part, es, d, err)
	}
	if ev := s.ev.Load(); ev != nil {
		(*ev).Synced(len(reqs), time.Since(start), failed)
	}
	s.failing.Store(failed != nil)
}

// applyPart applies a part's charge: the readings, and the new allowances
// (less what was admitted while the round was in flight).
func (s *Syncer) applyPart(now time.Time, part []int, es []*syncEntry, d []bucket.Decision, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for j, i := range part {
		e := es[i]
		switch {
		case err != nil && !bucket.MayHaveRun(err):
			e.sending = 0 // not sent: charged next time
			continue
		case err != nil: // may have run: counted charged, read next time
			e.spent -= e.sending
			e.sending, e.wants = 0, true
			s.flag(e)
			continue
		}
		e.spent -= e.sending
		e.sending = 0
		if turns := windowTurns(now, e.req.Policy); turns.Before(e.turns) {
			// of a period that turned while the round was in flight (a take
			// started the new one: periodTurned): the next round reads it
			e.wants = true
			s.flag(e)
			continue
		}
		e.remaining, e.reset, e.synced, e.turns = d[j].Remaining, d[j].Reset, now, windowTurns(now, e.req.Policy)
		e.full = fullAt(now, d[j])
		e.allowance = max(share(held(e.req.Policy, d[j])+refill(e.req), s.instances(int(s.floor.Load())))-e.spent, 0)
		e.granted = e.allowance
	}
}

// staleAfter is how long a bucket's admissions may wait to be charged
// while its allowance lasts (ten intervals, ten seconds at least): Redis's
// view (the fleet's headers, the admin API) lags by at most that, and a
// bucket that spends slowly costs Redis one charge per staleAfter, not
// one per interval. It is also how long an idle bucket is kept.
func staleAfter(interval time.Duration) time.Duration { return max(10*interval, 10*time.Second) }

// due lists the buckets to sync at now, marking what each charges: those
// refused for want of allowance, those that spent half of it, and those
// whose admissions waited staleAfter. Between two walks of every entry
// (every walkEvery, and the final round), it looks only at the queue of
// entries flagged as they were refused or spent half (flag): the others
// can only be due by waiting staleAfter, which a walk finds. A walk also
// drops those with nothing to tell that were idle for staleAfter and whose
// bucket is full again.
func (s *Syncer) due(now time.Time, final bool) ([]bucket.Request, []*syncEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var reqs []bucket.Request
	var es []*syncEntry
	charge := func(e *syncEntry) {
		e.periodTurned(now, s.instances(int(s.floor.Load())))
		r := e.req
		r.Cost, r.ID = e.spent, ""
		if r.Policy.Algorithm == bucket.TokenBucket && !e.used.IsZero() { // as of its last request (see gcra.lua)
			r.ID = "a" + strconv.FormatInt(max(now.Sub(e.used), 0).Microseconds(), 10)
		}
		e.sending, e.wants = e.spent, false
		reqs, es = append(reqs, r), append(es, e)
	}
	if !final && now.Sub(s.walked) < walkEvery {
		queue := s.queue
		s.queue = nil
		for _, e := range queue {
			e.queued = false
			switch s.verdict(e, now, false) {
			case dueNow:
				charge(e)
			case dueLater:
				s.flag(e)
			}
		}
		return reqs, es
	}
	s.walked = now
	for _, e := range s.queue {
		e.queued = false
	}
	s.queue = s.queue[:0]
	for id, e := range s.entries {
		switch s.verdict(e, now, final) {
		case dueNow:
			charge(e)
		case dueLater:
			if e.wants || 2*e.spent >= e.granted {
				s.flag(e)
			}
		case dueIdle:
			if !now.Before(e.reset) && now.Sub(e.used) > staleAfter(e.req.Sync) {
				delete(s.entries, id) // full again and idle: its next request reads Redis
			}
		}
	}
	return reqs, es
}

// walkEvery is how often a round looks at every entry (see due).
const walkEvery = time.Second

// verdict is what a round at now does with e (see due). The caller holds
// mu.
func (s *Syncer) verdict(e *syncEntry, now time.Time, final bool) int {
	interval, since := e.req.Sync, now.Sub(e.synced)
	switch {
	case final && e.spent > 0:
		return dueNow
	case since < interval:
		return dueLater
	case e.spent == 0 && !e.wants:
		return dueIdle
	case !e.wants && 2*e.spent < e.granted && since < staleAfter(interval):
		return dueNot
	}
	return dueNow
}

// flag queues e for the next rounds (see due). The caller holds mu.
func (s *Syncer) flag(e *syncEntry) {
	if !e.queued {
		e.queued = true
		s.queue = append(s.queue, e)
	}
}

// What a round does with an entry (verdict).
const (
	dueNot   = iota // nothing to charge yet
	dueNow          // charge and read it
	dueLater        // it was synced less than an interval ago
	dueIdle         // nothing to charge or read
)
