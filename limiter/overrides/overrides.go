package overrides

// Keeping the overrides current. Overrides holds the snapshot in force,
// read by every request with one atomic load, and replaces it when the
// overrides change:
//
//   - with the memory store, they live in this process: a change is the
//     new snapshot;
//   - with Redis, they live in three keys under the store's prefix, in one
//     hash slot: "{overrides}" (a hash: entry name -> JSON), its version
//     "{overrides}:version" ("<n>:<nonce>", a new one for every change, so
//     that a version lost with a write never comes back with other
//     contents), and the expiries "{overrides}:expiry" (a sorted set, so
//     that a change drops the expired entries without reading them all).
//
// A change is one script (overrides_write.lua): the entry written or
// deleted, the expired ones dropped (on Redis's clock), the version moved
// on, and the change announced, in the same script and so in the order of
// the changes, on the channel "{overrides}:changed" as "<previous version>
// <new version> <entry names...>". An instance that holds the previous
// version reads just those entries; one that missed a message, or whose
// version is another, reads the whole hash (in pages, between two reads of
// the version that must agree), at most once every wholeReadGap, and
// after a gap of at least wholeReadSpan times the last one's length: whole
// reads take at most a tenth of a core. What it reads is bounded
// (read.go). It also reads the version
// every poll interval, so that a missed message (a dropped subscription, a
// restart, a partition) heals on its own. The instance that makes a change
// applies it from the script's reply, without a read.
//
// Every whole read writes back, entry by entry, the changes the instance
// holds that Redis lacks (Redis restarted or failed over and lost the
// overrides, or their last changes; another instance wrote back an older
// state): restore.go.
//
// Reads are serialised (one at a time); messages queue (a bounded number)
// and are read together; while Redis cannot be read the last snapshot
// stays in force. A malformed entry is left out, and reported once; it
// never stops the others from loading.

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultPoll is how often an instance reads the overrides'
// version in Redis, besides the pushes.
const DefaultPoll = 10 * time.Second

// minRefreshGap spaces the reads that pushes cause, and expiryGap the
// wake-ups at expiries (requests check expiries themselves: these only
// keep the metric and the log current).
// wholeReadGap and wholeReadSpan the whole reads, whatever asks for them;
// failRetry the reads while they fail.
const (
	minRefreshGap = 100 * time.Millisecond
	expiryGap     = time.Second
	wholeReadGap  = time.Second
	wholeReadSpan = 10
	failRetry     = time.Second
)

// maxPending bounds the pushed changes waiting to be read; past it, the
// next read is a whole one.
const maxPending = 1024

// Events is told what happens to the overrides, to log and count.
type Events interface {
	// OverridesLoaded: s is in force from now on, read because of via
	// ("start", "reload", "push", "subscribe", "poll", "change",
	// "expiry", or "restore"); expired are the overrides of the last snapshot that
	// expired since.
	OverridesLoaded(s *Set, via string, expired []Entry)
	// OverrideSkipped: an entry could not be read; it is left out. Told
	// once per entry and value.
	OverrideSkipped(entry string, err error)
	// OverridesFailing: reading them failed (err), the last ones read
	// staying in force; or, with a nil err, reading works again. Called
	// on each change between the two.
	OverridesFailing(err error)
	// OverridesNotPushed: the subscription to the changes was not
	// confirmed in time (an ACL without the channel?): changes arrive
	// through the poll alone. Told once.
	OverridesNotPushed(err error)
	// OverridesRestored: this instance found Redis lacking n changes of
	// entries it held, not expired (why), and wrote them back.
	OverridesRestored(n int, why string)
	// OverridesOverLimit: the store holds held entries, more than
	// MaxEntries; read were read, the rest left out. Told once,
	// until the entries fit again.
	OverridesOverLimit(held, read int)
}

// Overrides holds the overrides in force and keeps them current (see the
// top of this file). Its methods are safe for concurrent use.
type Overrides struct {
	cur    atomic.Pointer[Set]
	src    overrideSource
	ev     Events
	poll   atomic.Int64 // ns
	kick   chan string  // coalesced wake-ups of run
	stop   chan struct{}
	done   chan struct{}
	start  sync.Once
	close  sync.Once
	readMu sync.Mutex // one read at a time
	// Under readMu:
	failing   atomic.Bool       // reads fail: run retries every failRetry
	over      bool              // OverridesOverLimit told
	dueVia    string            // why the whole read put off is due
	applied   []string          // the last versions applied, newest last
	logged    map[uint64]uint64 // the skipped entries reported, by their name's hash: their value's
	nextWhole atomic.Int64      // when the next whole read (or restore) may start, Unix ns
	wholeDue  atomic.Int64      // when a whole read put off is due, Unix ns; 0: none
	pendMu    sync.Mutex
	pending   []delta // pushed changes not read yet; nil and full: read all
	pendNames int     // the names in pending
	full      bool
	now       func() time.Time
	clk       hlc // the stamps of the changes made here
}

// delta is one change of the overrides: from version prev to next, of the
// entries named; changes holds their new values when known (a change made
// here), else they are read.
type delta struct {
	prev, next string
	names      []string
	changes    []entryChange
}

// overrideSource is where overrides live.
type overrideSource interface {
	// version is the version token of the overrides ("" for none yet).
	version(ctx context.Context) (string, error)
	load(ctx context.Context, skipped func(entry, value string, err error)) (*Set, error)
	// entries reads the entries named, those gone included.
	entries(ctx context.Context, names []string, skipped func(entry, value string, err error)) ([]entryChange, error)
	// write sets zone's entry (its key's when digest is set) to o, an
	// override or a tombstone, unless it holds a later change of it; it
	// says whether there was an override, and what changed.
	write(ctx context.Context, zone string, digest *[16]byte, o Override) (found bool, d delta, err error)
	// clock is the time overrides expire by.
	clock(ctx context.Context) (time.Time, error)
	// watch calls pushed on every change announced, and kick when what
	// was announced meanwhile may have been missed, until stop closes.
	watch(stop <-chan struct{}, pushed func(delta), kick func(via string), ev Events)
}

func newOverrides(src overrideSource, ev Events) *Overrides {
	o := &Overrides{src: src, ev: ev, kick: make(chan string, 1), stop: make(chan struct{}), done: make(chan struct{}),
		now: time.Now, logged: map[uint64]uint64{}, clk: hlc{origin: nonce()}}
	o.poll.Store(int64(DefaultPoll))
	return o
}

// NewMemory returns overrides kept in this process alone.
func NewMemory(ev Events) *Overrides {
	return newOverrides(&memoryOverrides{}, ev)
}

// Current is the snapshot in force; nil when there are none.
func (o *Overrides) Current() *Set {
	if o == nil {
		return nil
	}
	return o.cur.Load()
}

// Now is the time of the overrides' clock (Redis's, with Redis): expiries
// are set by it.
func (o *Overrides) Now(ctx context.Context) (time.Time, error) { return o.src.clock(ctx) }

// SetPoll sets how often the version is read (at least 100ms).
func (o *Overrides) SetPoll(d time.Duration) {
	o.poll.Store(int64(max(d, minRefreshGap)))
	o.wake("poll")
}

// Start reads the overrides once, before it returns (within ctx), then
// keeps them current in the background until Close. Only the first call
// starts; every call reads the version again, so that a config that loads
// serves the overrides in force.
func (o *Overrides) Start(ctx context.Context) error {
	first := false
	o.start.Do(func() { first = true })
	via := "reload"
	if first {
		via = "start"
	}
	err := o.refresh(ctx, via, first)
	if first {
		go o.run()
	}
	return err
}

// Close stops the background work.
func (o *Overrides) Close() {
	o.close.Do(func() {
		close(o.stop)
		started := true
		o.start.Do(func() { started = false })
		if started {
			<-o.done
		}
	})
}

// Put sets zone's override (the override of the key whose digest is
// digest, when not nil) to ov, and puts it in force here at once; the
// other instances read it on its push, or at their next poll. The error
// is the write's: once written, the change stands.
func (o *Overrides) Put(ctx context.Context, zone string, digest *[16]byte, ov Override) error {
	_, err := o.PutStamped(ctx, zone, digest, ov)
	return err
}

// PutStamped is Put, and returns the override as written, stamped: what
// to copy to other regions (Writer.Put). When the store holds a later
// change of the override (made elsewhere at once), that one stands.
func (o *Overrides) PutStamped(ctx context.Context, zone string, digest *[16]byte, ov Override) (Override, error) {
	ov.Deleted = false
	ov.Stamp = o.clk.next(o.now())
	if err := ov.Check(digest != nil); err != nil {
		return ov, err
	}
	_, d, err := o.src.write(ctx, zone, digest, ov)
	if err != nil {
		return ov, fmt.Errorf("writing the override: %w", err)
	}
	o.applyOwn(ctx, d)
	return ov, nil
}

// Delete removes zone's override (its key's, when digest is set), and
// says whether there was one.
func (o *Overrides) Delete(ctx context.Context, zone string, digest *[16]byte) (bool, error) {
	found, _, err := o.DeleteStamped(ctx, zone, digest)
	return found, err
}

// DeleteStamped is Delete, and returns the tombstone written: what to copy
// to other regions (Writer.Put). The tombstone is kept until the override
// would have expired (TombstoneTTL for one without expiry).
func (o *Overrides) DeleteStamped(ctx context.Context, zone string, digest *[16]byte) (bool, Override, error) {
	now := o.now()
	held, ok := o.cur.Load().held(zone, digest)
	tomb := tombstone(o.clk.next(now), held, ok && !held.Deleted, now)
	found, d, err := o.src.write(ctx, zone, digest, tomb)
	if err != nil {
		return false, tomb, fmt.Errorf("deleting the override: %w", err)
	}
	o.applyOwn(ctx, d)
	return found, tomb, nil
}

// applyOwn puts a change made here in force: from the change itself when
// the snapshot is at its previous version; not at all when its push was
// read first (the snapshot is at its version, or beyond), nor when it was
// not written (Redis holds a later change, whose push brings it); else by
// a whole read, which writes back what Redis lacks (it may fail: the
// change is then read at the next push or poll).
func (o *Overrides) applyOwn(ctx context.Context, d delta) {
	o.readMu.Lock()
	cur := o.cur.Load()
	switch {
	case d.prev == d.next: // nothing written: a later change held
	case cur.tokenOf() == d.prev:
		o.install(cur, cur.apply(d.changes, d.next), "change")
	case o.wasApplied(d.next): // in force already
	default:
		o.readMu.Unlock()
		_ = o.refresh(ctx, "change", true)
		return
	}
	o.readMu.Unlock()
}

// wake asks the background loop for a read, coalesced with any pending.
func (o *Overrides) wake(via string) {
	select {
	case o.kick <- via:
	default:
	}
}

// run reads on every push, every poll interval, and at the next expiry
// (to report the overrides in force), until Close.
func (o *Overrides) run() {
	defer close(o.done)
	watching := make(chan struct{})
	go func() { o.src.watch(o.stop, o.pushed, o.wake, o.ev); close(watching) }()
	defer func() { <-watching }()
	t := time.NewTimer(o.wait())
	defer t.Stop()
	for {
		via := "poll"
		select {
		case <-o.stop:
			return
		case via = <-o.kick:
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = o.refresh(ctx, via, false)
		cancel()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(o.wait())
		select { // space out the reads of a burst of pushes
		case <-o.stop:
			return
		case <-time.After(minRefreshGap):
		}
	}
}

// wait is how long until the next poll (failRetry while reads fail: a
// Redis that restarted may have lost the overrides), or the next expiry if
// sooner (at least expiryGap away), or the whole read put off if sooner.
func (o *Overrides) wait() time.Duration {
	d := time.Duration(o.poll.Load())
	if o.failing.Load() {
		d = min(d, failRetry)
	}
	if due := o.wholeDue.Load(); due != 0 {
		d = min(d, max(time.Until(time.Unix(0, due)), minRefreshGap))
	}
	now := o.now()
	if next := o.cur.Load().NextExpiry(now); !next.IsZero() {
		d = min(d, max(next.Sub(now)+time.Millisecond, expiryGap))
	}
	return d
}

// refresh brings the snapshot up to date: from the changes pushed when
// they follow on from it, else from the version and, when it moved (or
// when force), a whole read, which writes back what Redis lacks. The last
// snapshot stays on an error.
func (o *Overrides) refresh(ctx context.Context, via string, force bool) error {
	o.readMu.Lock()
	defer o.readMu.Unlock()
	cur := o.cur.Load()
	if via == "poll" && o.dueVia != "" { // the read put off
		via = o.dueVia
	}
	if !force {
		s, ok, err := o.readPushed(ctx, cur)
		if err != nil {
			return o.failed(err)
		}
		if ok {
			o.recovered()
			o.install(cur, s, via)
			return nil
		}
		token, err := o.src.version(ctx)
		if err != nil {
			return o.failed(err)
		}
		if cur != nil && token == cur.token {
			o.recovered()
			o.install(cur, cur, "expiry")
			return nil
		}
		if o.putOff(via) {
			return nil
		}
	}
	return o.readAll(ctx, cur, via)
}

// putOff reports whether a whole read (or a restore) comes before the
// gap after the last one passed, and if so has run do it then: version
// bumps cannot keep an instance reading. The caller holds readMu.
func (o *Overrides) putOff(via string) bool {
	next := time.Unix(0, o.nextWhole.Load())
	if time.Now().Before(next) {
		o.wholeDue.Store(next.UnixNano())
		o.dueVia = cmp.Or(o.dueVia, via)
		return true
	}
	return false
}

// wholeRead records that a whole read (or a restore) starts; the
// function it returns, that it ended: the next may start wholeReadGap
// after this one started, or wholeReadSpan times its length after it
// ended if later. The caller holds readMu.
func (o *Overrides) wholeRead() (ended func()) {
	start := time.Now()
	o.nextWhole.Store(start.Add(wholeReadGap).UnixNano())
	o.wholeDue.Store(0)
	o.dueVia = ""
	return func() {
		took := time.Since(start)
		o.nextWhole.Store(start.Add(max(wholeReadGap, took+wholeReadSpan*took)).UnixNano())
	}
}

// readAll puts in force a whole read of the overrides, with the entries
// of cur that Redis lacks written back (restore.go). The caller holds
// readMu.
func (o *Overrides) readAll(ctx context.Context, cur *Set, via string) error {
	o.takePending() // a whole read covers them
	ended := o.wholeRead()
	defer ended()
	s, err := o.src.load(ctx, o.skipped)
	if err == nil && !strings.HasPrefix(s.tokenOf(), "?") {
		before := s
		if s, err = o.mergeBack(ctx, cur, s); err == nil && s != before {
			via = "restore"
		}
	}
	if err != nil {
		return o.failed(err)
	}
	o.recovered()
	if over := s.leftOut(); over > 0 && !o.over {
		o.ev.OverridesOverLimit(MaxEntries+over, MaxEntries)
	}
	o.over = s.leftOut() > 0
	o.install(cur, s, via)
	return nil
}

// install puts s in force in place of cur, without the overrides expired
// by now, and reports it (and the expired ones); nothing when nothing
// changed. The caller holds readMu.
func (o *Overrides) install(cur, s *Set, via string) {
	now := o.now()
	gone := cur.expired(now)
	if s == cur && len(gone) == 0 {
		return
	}
	s = s.prune(now)
	o.clk.observe(s.newest)
	o.cur.Store(s)
	if t := s.tokenOf(); t != "" {
		o.applied = append(o.applied, t)
		if len(o.applied) > 64 {
			o.applied = o.applied[1:]
		}
	}
	o.ev.OverridesLoaded(s, via, gone)
}

// skipped reports an entry that cannot be read, once per entry and value
// (at most 1,000 entries remembered, by hashes). The caller holds readMu.
func (o *Overrides) skipped(entry, value string, err error) {
	name, sum := fnv.New64a(), fnv.New64a()
	name.Write([]byte(entry))
	sum.Write([]byte(value))
	if prev, ok := o.logged[name.Sum64()]; ok && prev == sum.Sum64() || !ok && len(o.logged) >= 1000 {
		return
	}
	o.logged[name.Sum64()] = sum.Sum64()
	o.ev.OverrideSkipped(fmt.Sprintf("%.120q", entry), err)
}

func (o *Overrides) failed(err error) error {
	if !o.failing.Load() {
		o.failing.Store(true)
		o.ev.OverridesFailing(err)
	}
	return err
}

func (o *Overrides) recovered() {
	if o.failing.Load() {
		o.failing.Store(false)
		o.ev.OverridesFailing(nil)
	}
}
