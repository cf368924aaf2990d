package regions

// The run-time overrides of global zones are global: a change made
// through the admin API (Exchange.CopyOverride) is written to every peer
// region's Redis as well (overrides.Writer), at once; a region that
// cannot be reached gets it as soon as it can, tried again every interval. Each change carries
// its stamp (overrides.Stamp) and a deletion is a tombstone: the region's Redis keeps the later
// of the change copied and the one it holds, whatever the order the copies arrive in, so that
// after a partition every region holds the latest change of each override; a change that
// expired meanwhile is dropped.

import (
	"cmp"
	"context"
	"encoding/hex"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// overrideCopies copies changes of overrides to the peer regions.
type overrideCopies struct {
	interval, timeout time.Duration
	peers             map[string]*peerCopies
	stop              chan struct{}
	done              sync.WaitGroup
	once              sync.Once
}

// peerCopies are the changes to write to one peer region.
type peerCopies struct {
	w       *overrides.Writer
	writing sync.Mutex // one writer at a time, in the order of the changes
	mu      sync.Mutex
	queue   map[string]overrideChange // by zone and digest: the latest change
	seq     uint64
}

// overrideChange is a change of an override: o, stamped, a tombstone
// for a deletion.
type overrideChange struct {
	zone   string
	digest *[16]byte
	o      *overrides.Override
	seq    uint64
}

func newOverrideCopies(writers map[string]*overrides.Writer, interval, timeout time.Duration) *overrideCopies {
	c := &overrideCopies{interval: interval, timeout: timeout, peers: map[string]*peerCopies{}, stop: make(chan struct{})}
	for name, w := range writers {
		c.peers[name] = &peerCopies{w: w, queue: map[string]overrideChange{}}
	}
	return c
}

// start starts trying the copies queued again, every interval.
func (c *overrideCopies) start() {
	if len(c.peers) == 0 {
		return
	}
	c.done.Add(1)
	go c.retry()
}

// close stops the copies; what was not written is dropped.
func (c *overrideCopies) close() {
	c.once.Do(func() { close(c.stop); c.done.Wait() })
}

// CopyOverride writes a change of an override of a global zone (o as
// overrides.PutStamped or DeleteStamped returned it: stamped, a tombstone
// for a deletion; digest nil: the zone's own) to every peer region's
// Redis, each within the timeout, and tells for each region whether it
// was written (the region's Redis holds it, or a later change) or is
// queued, to be written as soon as the region answers (and why). Nil
// without writers.
func (x *Exchange) CopyOverride(zone string, digest *[16]byte, o *overrides.Override) map[string]string {
	if len(x.copies.peers) == 0 || o == nil {
		return nil
	}
	return x.copies.change(zone, digest, o)
}

// change writes a change to every peer region, each within the timeout,
// and tells for each whether it was written or is queued (and why).
func (c *overrideCopies) change(zone string, digest *[16]byte, o *overrides.Override) map[string]string {
	names := slices.Sorted(maps.Keys(c.peers))
	results := make([]string, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		p := c.peers[name]
		seq := p.add(zone, digest, o)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			results[i] = "written"
			if err := p.flush(ctx, seq); err != nil {
				results[i] = "queued, written as soon as the region answers: " + err.Error()
			}
		}()
	}
	wg.Wait()
	out := map[string]string{}
	for i, name := range names {
		out[name] = results[i]
	}
	return out
}

// retry writes what is queued every interval.
func (c *overrideCopies) retry() {
	defer c.done.Done()
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		for _, p := range c.peers {
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			_ = p.flush(ctx, 0)
			cancel()
		}
	}
}

// add queues a change, replacing an earlier one of the same override (by
// their stamps: a later change queued stays), and returns its sequence
// number.
func (p *peerCopies) add(zone string, digest *[16]byte, o *overrides.Override) uint64 {
	if digest != nil {
		d := *digest
		digest = &d
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	ch := overrideChange{zone: zone, digest: digest, o: o, seq: p.seq}
	if q, ok := p.queue[changeName(ch)]; !ok || q.o.Stamp.Compare(o.Stamp) <= 0 {
		p.queue[changeName(ch)] = ch
	}
	return p.seq
}

// flush writes the changes queued, oldest first, until one fails; it
// returns that failure when the change of sequence number seq (0: any)
// is still queued.
func (p *peerCopies) flush(ctx context.Context, seq uint64) error {
	p.writing.Lock()
	defer p.writing.Unlock()
	p.mu.Lock()
	changes := slices.SortedFunc(maps.Values(p.queue), func(a, b overrideChange) int { return cmp.Compare(a.seq, b.seq) })
	p.mu.Unlock()
	now := time.Now()
	var err error
	for _, ch := range changes {
		if ch.o.Active(now) { // else expired: nothing to copy
			err = p.w.Put(ctx, ch.zone, ch.digest, *ch.o)
		}
		if err != nil {
			return p.failed(err, seq)
		}
		p.mu.Lock()
		if cur, ok := p.queue[changeName(ch)]; ok && cur.seq == ch.seq {
			delete(p.queue, changeName(ch))
		}
		p.mu.Unlock()
	}
	return nil
}

// failed is err when the change of sequence number seq is still queued.
func (p *peerCopies) failed(err error, seq uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ch := range p.queue {
		if seq == 0 || ch.seq == seq {
			return err
		}
	}
	return nil
}

// changeName is the queue's name of ch.
func changeName(ch overrideChange) string {
	if ch.digest == nil {
		return ch.zone
	}
	return ch.zone + " " + hex.EncodeToString(ch.digest[:])
}
