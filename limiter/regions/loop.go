package regions

import (
	"context"
	"errors"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Start starts the exchanges: one goroutine per peer, and the ticker that
// hands them the counts every interval. Close stops them.
func (x *Exchange) Start() {
	x.start.Do(func() {
		now := x.now()
		x.started = now
		for _, s := range x.peers {
			s.mu.Lock()
			s.lastOK = now // a link is up until it fails for LinkTimeout
			s.mu.Unlock()
			x.senders.Add(1)
			go func() { defer x.senders.Done(); s.run(x.stopSenders) }()
		}
		x.ticking.Add(1)
		go func() { defer x.ticking.Done(); x.tick() }()
		x.copies.start()
	})
}

// Close stops the exchanges: what was counted since the last interval is
// handed out and told in a last exchange with each peer (within the
// timeout), as a Syncer's last round charges what is left; then the
// copies of overrides.
func (x *Exchange) Close() {
	x.close.Do(func() {
		close(x.stop)
		x.ticking.Wait() // its last hand-out made
		close(x.stopSenders)
		x.senders.Wait()
		x.copies.close() // what was not copied is dropped
	})
}

// tick hands the counts to the senders and reads the marks every
// interval, from a phase of its own (x.phase), and hands out the last
// counts when the Exchange closes. Instances started together (a
// fleet's rollout, a reload sent to all) would otherwise charge each
// peer's Redis at one instant, every interval, and that region's
// requests would wait behind all the charges at once.
func (x *Exchange) tick() {
	select {
	case <-x.stop:
		x.handOut()
		return
	case <-time.After(x.phase):
	}
	t := time.NewTicker(x.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-x.stop:
			x.handOut()
			return
		case <-t.C:
			x.handOut()
			x.count()
		}
	}
}

// handOut gives every sender the counts since the last interval.
func (x *Exchange) handOut() {
	x.mu.Lock()
	counts, overflow := x.pending, x.overflow
	x.pending, x.overflow = make(map[bucket.ID]count, len(counts)), 0
	x.mu.Unlock()
	if overflow > 0 {
		x.flooded()
	}
	for _, s := range x.peers {
		s.add(counts) // wakes it even when empty: its mark
	}
	if ev := x.events(); ev != nil && overflow > 0 {
		ev.Dropped("", overflow)
	}
}

// count sets the regions counted as admitting up to the rate: every
// region while this one exchanges with each peer both ways (its link to
// the peer is up, and the peer's mark is in this region's Redis); else
// this one alone, deciding with its share, rate / R. A region cut off from
// one peer only counts itself alone too: that peer may admit its own
// share and more unseen, so no region but one that sees every other can
// take the rate of another (see the package doc). An instance starts
// alone too (New), and counts the others once it has exchanged with each
// and heard each: one that starts during a partition never takes the rate
// of a region it cannot reach; a fleet that starts together decides with
// its shares for an interval or two. When this region's Redis cannot tell
// the marks, only the links count.
func (x *Exchange) count() {
	ctx, cancel := context.WithTimeout(context.Background(), x.cfg.Timeout)
	defer cancel()
	marks, err := x.cfg.Home.RegionMarks(ctx, x.names, maxMark)
	if err == nil && len(marks) != len(x.names) {
		err = errMarks
	}
	starting := x.now().Sub(x.started) < LinkTimeout(x.cfg.Interval, x.cfg.Timeout)
	own := x.own.Load().f
	k := x.regions
	for i, s := range x.peers {
		seen, agrees := err == nil && marks[i] != "", true
		if err == nil && (seen || !starting) { // a mark missing at the start is not news
			s.hear(seen)
		}
		if seen {
			diff := own.differs(marks[i])
			s.differ(diff)
			agrees = diff == ""
		}
		if !s.counts() || err == nil && (!seen || !agrees) {
			k = 1
		}
	}
	flooding := x.flooding()
	if flooding {
		k = 1
	}
	x.reportFlood(flooding) // before the store: told, then counted
	x.counted.Store(k)
	if k > 1 && x.flooding() { // a flood that began since wins
		x.counted.Store(1)
	}
}

// errMarks: a reply of the marks that does not hold one per region.
var errMarks = errors.New("marks of the regions: a reply of the wrong length")

// Link is what this instance knows of the link to one peer region.
type Link struct {
	Region string
	Up     bool
	Heard  bool      // its mark was in this region's Redis at the last count
	LastOK time.Time // the last exchange that succeeded
}

// Links tells the links to the peers, and how many regions are counted
// as admitting up to the rate (Regions while every link is up).
func (x *Exchange) Links() ([]Link, int) {
	links := make([]Link, len(x.peers))
	for i, s := range x.peers {
		up, at := s.isUp()
		s.mu.Lock()
		heard := !s.unheard
		s.mu.Unlock()
		links[i] = Link{Region: s.name, Up: up, Heard: heard, LastOK: at}
	}
	return links, int(x.counted.Load())
}
