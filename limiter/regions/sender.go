package regions

import (
	"cmp"
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// sender tells one peer region what this instance admitted: its own
// goroutine, so that a slow peer holds nothing else.
type sender struct {
	x       *Exchange
	name    string
	peer    Peer
	mu      sync.Mutex
	backlog map[bucket.ID]count // to charge the peer
	bans    map[bucket.ID]ban   // to tell the peer
	dropped int                 // buckets dropped since the last report
	wake    chan struct{}
	lastOK  time.Time // the last exchange that succeeded (or the start)
	up      bool
	told    bool      // an exchange succeeded since the start: the peer has heard from this instance
	down    bool      // reported down, not yet up again
	unheard bool      // its mark was missing at the last count: reported, not yet back
	charged bool      // the last exchange's charges succeeded (or none was made yet)
	taken   time.Time // the last take
}

// hear takes whether the peer's mark is in this region's Redis, and tells
// Events.Heard when that changes (it starts heard: a peer is reported
// once its mark is missing).
func (s *sender) hear(seen bool) {
	s.mu.Lock()
	changed := s.unheard == seen
	s.unheard = !seen
	s.mu.Unlock()
	if ev := s.x.events(); ev != nil && changed {
		ev.Heard(s.name, seen)
	}
}

func newSender(x *Exchange, name string, p Peer) *sender {
	return &sender{x: x, name: name, peer: p, backlog: map[bucket.ID]count{}, bans: map[bucket.ID]ban{},
		wake: make(chan struct{}, 1), up: true, charged: true}
}

// ban is a ban to tell a peer: its client's bucket, and when it ends.
type ban struct {
	req   bucket.Request
	until time.Time
}

// ban queues a ban of r's client until until (the longest of those
// queued), at most maxBacklog.
func (s *sender) ban(r bucket.Request, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := bucket.IDOf(r)
	if b, ok := s.bans[id]; ok && !b.until.Before(until) || !ok && len(s.bans) >= maxBacklog {
		return
	}
	s.bans[id] = ban{req: r, until: until}
}

// tellBans tells the peer the bans queued, at most maxBansTold an
// exchange (the rest at the next), by banWorkers at once; those that
// failed are queued again (a ban is told again at no risk). It returns
// the first error.
func (s *sender) tellBans(ctx context.Context) error {
	s.mu.Lock()
	bans := make([]ban, 0, min(len(s.bans), maxBansTold))
	for id, b := range s.bans {
		if len(bans) == maxBansTold {
			break
		}
		bans = append(bans, b)
		delete(s.bans, id)
	}
	s.mu.Unlock()
	now := s.x.now()
	errs := make([]error, len(bans))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(banWorkers, len(bans)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if errs[i] = s.peer.Ban(ctx, bans[i].req, bans[i].until.Sub(now)); errs[i] != nil {
					s.ban(bans[i].req, bans[i].until)
				}
			}
		}()
	}
	for i := range bans {
		next <- i
	}
	close(next)
	wg.Wait()
	return cmp.Or(errs...)
}

// At most maxBansTold bans are told a peer in an exchange, by banWorkers
// calls at once.
const (
	maxBansTold = 1000
	banWorkers  = 8
)

// add merges counts into the backlog, at most maxBacklog buckets.
func (s *sender) add(counts map[bucket.ID]*count) {
	s.mu.Lock()
	for id, c := range counts {
		if _, ok := s.backlog[id]; !ok && len(s.backlog) >= maxBacklog {
			s.dropped++
			continue
		}
		s.merge(id, c.req, c.cost)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default: // an exchange is due already
	}
}

// run exchanges with the peer whenever counts were added, until stop;
// before the first, it prepares the peer (Peer.Prepare), within a few
// timeouts: a peer that cannot be prepared is exchanged with all the same.
func (s *sender) run(stop <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), prepareTimeouts*s.x.cfg.Timeout)
	go func() { // a Close does not wait for it
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	_ = s.peer.Prepare(ctx)
	cancel()
	for {
		select {
		case <-stop:
			s.exchange() // the last counts, handed out as the Exchange closed
			return
		case <-s.wake:
			s.exchange()
		}
	}
}

// prepareTimeouts is how many exchange timeouts a peer's preparation may
// take: a connection to each node, the slot map, the scripts' loads.
const prepareTimeouts = 4

// exchange charges the peer the backlog, in parts (by node), and marks
// this region there, all at once. A part certainly not run stays in the backlog; one
// that may have run is counted charged (never sent twice). Once no
// exchange succeeded for linkTimeout, the link is down: the backlog is
// dropped (the peer counts this region at its share meanwhile).
func (s *sender) exchange() {
	x := s.x
	ctx, cancel := context.WithTimeout(context.Background(), x.cfg.Timeout)
	defer cancel()
	start := time.Now()
	reqs, ids := s.take(x.now())
	bans, mark := make(chan error, 1), make(chan error, 1) // at once with the charges: one round trip
	go func() { bans <- s.tellBans(ctx) }()
	go func() { mark <- s.mark(ctx) }()
	charged := s.charge(ctx, reqs, ids)
	s.mu.Lock()
	s.charged = charged == nil
	s.mu.Unlock()
	failed := errors.Join(charged, <-bans, <-mark)
	if ev := x.events(); ev != nil {
		n := len(reqs)
		if charged != nil {
			n = 0 // given back, or lost: not charged as far as it knows
		}
		ev.Exchanged(s.name, n, time.Since(start), failed)
	}
	s.record(x.now(), failed)
}

// mark marks this region in the peer's Redis, unless the last exchange's
// charges failed: a peer must not hear a region whose counts do not reach
// it (it would count it at the whole rate). A mark skipped is a failure.
func (s *sender) mark(ctx context.Context) error {
	s.mu.Lock()
	ok := s.charged
	s.mu.Unlock()
	if !ok {
		return errNoMark
	}
	return s.peer.MarkRegion(ctx, s.x.cfg.This, LinkTimeout(s.x.cfg.Interval, s.x.cfg.Timeout))
}

// errNoMark: a mark skipped after charges that failed.
var errNoMark = errors.New("not marked: the last charges failed")

// charge charges reqs to the peer, its parts (by node) at once: an
// exchange costs one round trip to the peer, not one per node.
func (s *sender) charge(ctx context.Context, reqs []bucket.Request, ids []bucket.ID) error {
	if len(reqs) == 0 {
		return nil
	}
	parts := s.peer.Groups(ctx, reqs)
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for j, part := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[j] = s.peer.ChargeAll(ctx, bucket.Pick(reqs, part))
			if errs[j] != nil && !bucket.MayHaveRun(errs[j]) {
				s.giveBack(reqs, ids, part)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// take empties the backlog into requests to charge, at now. A bucket's
// charge is at most twice what this instance can have admitted of it
// since the last take (its share of the burst and the refill meanwhile):
// what no decision here could have admitted is no one's to charge.
func (s *sender) take(now time.Time) ([]bucket.Request, []bucket.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	elapsed := now.Sub(s.taken)
	if s.taken.IsZero() {
		elapsed = s.x.cfg.Interval
	}
	s.taken = now
	reqs := make([]bucket.Request, 0, len(s.backlog))
	ids := make([]bucket.ID, 0, len(s.backlog))
	for id, c := range s.backlog {
		r := c.req
		r.Cost = min(c.cost, maxCharge(r.Policy, elapsed))
		reqs, ids = append(reqs, r), append(ids, id)
	}
	clear(s.backlog)
	return reqs, ids
}

// maxCharge is twice what a bucket of policy p (its burst the region's
// share) admits in elapsed, at least 1.
func maxCharge(p bucket.Policy, elapsed time.Duration) int64 {
	if p.Period <= 0 {
		return math.MaxInt64 / 2
	}
	refill := float64(p.Rate) * float64(max(elapsed, 0)) / float64(p.Period)
	return max(2*(p.Burst+int64(min(refill, float64(math.MaxInt64/8)))), 1)
}

// giveBack puts the requests of part, not charged, back in the backlog.
func (s *sender) giveBack(reqs []bucket.Request, ids []bucket.ID, part []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, i := range part {
		s.merge(ids[i], reqs[i], reqs[i].Cost)
	}
}

// merge adds cost to the backlog's count of id (r's bucket); s.mu held.
func (s *sender) merge(id bucket.ID, r bucket.Request, cost int64) {
	b, ok := s.backlog[id]
	if !ok {
		b.req = r
	}
	b.cost = min(b.cost+cost, math.MaxInt64/2)
	s.backlog[id] = b
}

// record takes an exchange's result at now: the link comes up at a
// success, goes down after LinkTimeout without one (reported once each).
func (s *sender) record(now time.Time, err error) {
	s.mu.Lock()
	changed, dropped := false, 0
	switch {
	case err == nil:
		s.lastOK, s.told = now, true
		changed, s.up, s.down = s.down, true, false
	case now.Sub(s.lastOK) >= LinkTimeout(s.x.cfg.Interval, s.x.cfg.Timeout):
		changed, s.up = !s.down, false
		s.down = true
		dropped = len(s.backlog)
		clear(s.backlog) // counted at this region's share by the peer; bans kept: told again at no risk
	}
	dropped += s.dropped
	s.dropped = 0
	s.mu.Unlock()
	ev := s.x.events()
	if ev == nil {
		return
	}
	if changed {
		ev.LinkChanged(s.name, err == nil, err)
	}
	if dropped > 0 {
		ev.Dropped(s.name, dropped)
	}
}

// isUp reports whether the link to the peer is up, and since when the
// last exchange succeeded.
func (s *sender) isUp() (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.up, s.lastOK
}

// counts reports whether the link may count the peer as admitting up to
// the rate: it is up, and an exchange has succeeded since the start (a
// link is reported up from the start until it fails, but an instance that
// starts during a partition has told the peer nothing).
func (s *sender) counts() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.up && s.told
}

// linkTimeout is how long a link lasts without an exchange that
// succeeded: an exchange starts every interval and may take timeout, so
// two of them in a row may fail within it.
func LinkTimeout(interval, timeout time.Duration) time.Duration {
	return linkTimeouts * (interval + timeout)
}
