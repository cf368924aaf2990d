package regions

import (
	"context"
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
			s.lastOK = now // a link is up until it fails for linkTimeout
			s.mu.Unlock()
			x.done.Add(1)
			go func() { defer x.done.Done(); s.run(x.stop) }()
		}
		x.done.Add(1)
		go func() { defer x.done.Done(); x.tick() }()
	})
}

// Close stops the exchanges; what was not told is dropped.
func (x *Exchange) Close() {
	x.close.Do(func() {
		close(x.stop)
		x.done.Wait()
	})
}

// tick hands the counts to the senders and reads the marks every interval.
func (x *Exchange) tick() {
	t := time.NewTicker(x.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-x.stop:
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
	x.pending, x.overflow = make(map[bucket.ID]*count, len(counts)), 0
	x.mu.Unlock()
	for _, s := range x.peers {
		s.add(counts) // wakes it even when empty: its mark
	}
	if ev := x.events(); ev != nil && overflow > 0 {
		ev.Dropped("", overflow)
	}
}

// count sets the regions counted as admitting up to the rate: this one
// and the peers it exchanges with both ways (its link to the peer is up,
// and the peer's mark is in this region's Redis, or LinkTimeout has not
// passed since the start: a link is up until it fails that long). A peer it cannot reach
// counts this region at its share; one it cannot hear from, it counts at
// its share. When this region's Redis cannot tell the marks, only the
// links count.
func (x *Exchange) count() {
	ctx, cancel := context.WithTimeout(context.Background(), x.cfg.Timeout)
	defer cancel()
	seen, err := x.cfg.Home.RegionsSeen(ctx, x.names)
	if err == nil && x.now().Sub(x.started) < LinkTimeout(x.cfg.Interval, x.cfg.Timeout) {
		for i := range seen { // the peers start too: heard until they could have marked
			seen[i] = true
		}
	}
	k := x.regions
	for i, s := range x.peers {
		if err == nil {
			s.hear(seen[i])
		}
		if up, _ := s.isUp(); !up || err == nil && !seen[i] {
			k--
		}
	}
	x.counted.Store(k)
}

// Link is what this instance knows of the link to one peer region.
type Link struct {
	Region string
	Up     bool
	LastOK time.Time // the last exchange that succeeded
}

// Links tells the links to the peers, and how many regions are counted
// as admitting up to the rate (Regions while every link is up).
func (x *Exchange) Links() ([]Link, int) {
	links := make([]Link, len(x.peers))
	for i, s := range x.peers {
		up, at := s.isUp()
		links[i] = Link{Region: s.name, Up: up, LastOK: at}
	}
	return links, int(x.counted.Load())
}
