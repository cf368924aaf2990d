package regions

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/errs"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// sender tells one peer region what this instance admitted: its own
// goroutine, so that a slow peer holds nothing else.
type sender struct {
	x          *Exchange
	name       string
	peer       Peer
	mu         sync.Mutex
	backlog    map[bucket.ID]count // to charge the peer
	doubts     map[bucket.ID]doubt // charged, may not have run: to charge again (see charges.go)
	epoch      uint64              // exchanges made
	bans       map[bucket.ID]ban   // to tell the peer
	dropped    int                 // buckets dropped since the last report
	health     health              // the last exchanges' failures
	degradedAt time.Time           // when health last changed
	wake       chan struct{}
	lastOK     time.Time // the last exchange that succeeded (or the start)
	up         bool
	told       bool         // an exchange succeeded since the start: the peer has heard from this instance
	unheard    bool         // its mark was missing at the last count: reported, not yet back
	differs    string       // what its fingerprint differs in at the last count: reported, "" when it agrees
	charged    bool         // the last exchange's charges succeeded (or none was made yet)
	taken      time.Time    // the last take
	oneWay     atomic.Int64 // ns: half the mean time of the last exchange's charges that ran (withLevels)
}

// differ takes what the peer's fingerprint differs in ("" for nothing),
// and tells Events.ConfigDiffers when that changes.
func (s *sender) differ(diff string) {
	s.mu.Lock()
	changed := s.differs != diff
	s.differs = diff
	s.mu.Unlock()
	if ev := s.x.events(); ev != nil && changed {
		ev.ConfigDiffers(s.name, diff)
	}
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
	return &sender{x: x, name: name, peer: p, backlog: map[bucket.ID]count{}, doubts: map[bucket.ID]doubt{}, bans: map[bucket.ID]ban{},
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

// add merges counts into the backlog, at most maxBacklog buckets with
// those in doubt.
func (s *sender) add(counts map[bucket.ID]count) {
	s.mu.Lock()
	for id, c := range counts {
		if _, ok := s.backlog[id]; !ok && len(s.backlog)+len(s.doubts) >= maxBacklog {
			s.dropped++
			s.x.flooded()
			continue
		}
		s.merge(id, c)
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

// exchange charges the peer the backlog and the buckets in doubt, in
// parts (by node), and marks this region there, all at once. A part that
// fails puts its buckets in doubt, charged again at the next exchanges
// (charges.go). Once no exchange succeeded for LinkTimeout, the link is
// down: the backlog and the doubts are dropped (the peer counts this
// region at its share meanwhile).
func (s *sender) exchange() {
	x := s.x
	ctx, cancel := context.WithTimeout(context.Background(), x.cfg.Timeout)
	defer cancel()
	start := time.Now()
	s.epoch++
	var reqs []bucket.Request
	var all []sent
	if !s.resting(x.now()) && !s.disagrees() {
		reqs, all = s.take(x.now(), s.epoch)
	}
	bans, mark := make(chan error, 1), make(chan error, 1) // at once with the charges: one round trip
	go func() { bans <- s.tellBans(ctx) }()
	go func() { mark <- s.mark(ctx) }()
	var charged error
	n := 0
	if all == nil && s.resting(x.now()) {
		charged = s.peer.Ping(ctx) // the link's health, charging nothing
	} else {
		n, charged = s.charge(ctx, reqs, all)
	}
	s.mu.Lock()
	s.charged = charged == nil
	s.mu.Unlock()
	told, marked := <-bans, <-mark
	failed := errs.Join(charged, told, marked) // one line: it is logged
	if ev := x.events(); ev != nil {
		ev.Exchanged(s.name, n, time.Since(start), failed)
	}
	if errors.Is(marked, errNoMark) {
		marked = nil // the charges' failure, counted once
	}
	s.record(x.now(), failed, errs.Join(charged, told, marked))
}

// mark marks this region in the peer's Redis, unless the last exchange's
// charges failed (a failure) or the link is degraded: a peer must not hear
// a region whose counts may not reach it (it would count it at the whole
// rate).
func (s *sender) mark(ctx context.Context) error {
	s.mu.Lock()
	ok, degraded := s.charged, s.health.degraded
	s.mu.Unlock()
	switch {
	case !ok:
		return errNoMark
	case degraded || s.x.flooding():
		return nil
	}
	return s.peer.MarkRegion(ctx, s.x.cfg.This, s.x.own.Load().mark, LinkTimeout(s.x.cfg.Interval, s.x.cfg.Timeout))
}

// errNoMark: a mark skipped after charges that failed.
var errNoMark = errors.New("not marked: the last charges failed")

// record takes an exchange's result at now: err, its failure, and
// failure, what of it counts towards the link's health (see health). The
// link is up while exchanges succeed and it is not degraded; it goes down
// after LinkTimeout without a success, or once degraded (reported once
// each way).
func (s *sender) record(now time.Time, err, failure error) {
	s.mu.Lock()
	dropped, why := 0, err
	if err == nil {
		s.lastOK, s.told = now, true
	}
	if s.health.add(failure != nil) {
		why, s.degradedAt = s.health.err(failure), now
	}
	if now.Sub(s.lastOK) >= LinkTimeout(s.x.cfg.Interval, s.x.cfg.Timeout) {
		dropped = len(s.backlog) + len(s.doubts)
		clear(s.backlog) // counted at this region's share by the peer; bans kept: told again at no risk
		clear(s.doubts)
		why = err
	}
	up := now.Sub(s.lastOK) < LinkTimeout(s.x.cfg.Interval, s.x.cfg.Timeout) && !s.health.degraded
	changed := up != s.up
	s.up = up
	if up {
		why = nil
	}
	dropped += s.dropped
	s.dropped = 0
	s.mu.Unlock()
	ev := s.x.events()
	if ev == nil {
		return
	}
	if changed {
		ev.LinkChanged(s.name, up, why)
	}
	if dropped > 0 {
		ev.Dropped(s.name, dropped)
	}
}

// resting reports whether the link has been degraded for LinkTimeout at
// now: the peer no longer hears this region (its last mark expired) and
// counts it at its share, so nothing is charged it: the counts for it are
// dropped (and reported), and each exchange pings it instead, until the
// link is healthy again (see health.go).
func (s *sender) resting(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.health.degraded || now.Sub(s.degradedAt) < LinkTimeout(s.x.cfg.Interval, s.x.cfg.Timeout) {
		return false
	}
	s.dropped += len(s.backlog) + len(s.doubts)
	clear(s.backlog)
	clear(s.doubts)
	return true
}

// disagrees reports whether the peer's fingerprint differs from this
// region's: it does not count this region, nor this one it, and nothing
// is charged it (the counts for it are dropped, and reported).
func (s *sender) disagrees() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.differs == "" {
		return false
	}
	s.dropped += len(s.backlog) + len(s.doubts)
	clear(s.backlog)
	clear(s.doubts)
	return true
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
