package limiter

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
// version reads just those entries (HMGET); one that missed a message, or
// whose version is another, reads the whole hash (HSCAN, in pages, between
// two reads of the version that must agree). It also reads the version
// every poll interval, so that a missed message (a dropped subscription, a
// restart, a partition) heals on its own. The instance that makes a change
// applies it from the script's reply, without a read.
//
// Reads are serialised (one at a time); messages queue (a bounded number)
// and are read together; while Redis cannot be read the last snapshot
// stays in force. A malformed entry is left out, and reported once; it
// never stops the others from loading.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
	"github.com/redis/go-redis/v9"
)

// DefaultOverridesPoll is how often an instance reads the overrides'
// version in Redis, besides the pushes.
const DefaultOverridesPoll = 10 * time.Second

// minRefreshGap spaces the reads that pushes cause, and expiryGap the
// wake-ups at expiries (requests check expiries themselves: these only
// keep the metric and the log current).
const (
	minRefreshGap = 100 * time.Millisecond
	expiryGap     = time.Second
)

// maxPending bounds the pushed changes waiting to be read; past it, the
// next read is a whole one.
const maxPending = 1024

// OverrideEvents is told what happens to the overrides, to log and count.
type OverrideEvents interface {
	// OverridesLoaded: s is in force from now on, read because of via
	// ("start", "reload", "push", "subscribe", "poll", "change", or
	// "expiry"); expired are the overrides of the last snapshot that
	// expired since.
	OverridesLoaded(s *OverrideSet, via string, expired []OverrideEntry)
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
}

// Overrides holds the overrides in force and keeps them current (see the
// top of this file). Its methods are safe for concurrent use.
type Overrides struct {
	cur    atomic.Pointer[OverrideSet]
	src    overrideSource
	ev     OverrideEvents
	poll   atomic.Int64 // ns
	kick   chan string  // coalesced wake-ups of run
	stop   chan struct{}
	done   chan struct{}
	start  sync.Once
	close  sync.Once
	readMu sync.Mutex // one read at a time
	// Under readMu:
	failing bool
	applied []string          // the last versions applied, newest last
	logged  map[string]uint64 // the skipped entries reported, by name: their value's hash
	pendMu  sync.Mutex
	pending []delta // pushed changes not read yet; nil and full: read all
	full    bool
	now     func() time.Time
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
	load(ctx context.Context, skipped func(entry, value string, err error)) (*OverrideSet, error)
	// entries reads the entries named, those gone included.
	entries(ctx context.Context, names []string, skipped func(entry, value string, err error)) ([]entryChange, error)
	// write sets zone's override (its key's when digest is set) to o, or
	// deletes it when o is nil; it says whether there was one, and what
	// changed.
	write(ctx context.Context, zone string, digest *[16]byte, o *Override) (found bool, d delta, err error)
	// clock is the time overrides expire by.
	clock(ctx context.Context) (time.Time, error)
	// watch calls pushed on every change announced, and kick when what
	// was announced meanwhile may have been missed, until stop closes.
	watch(stop <-chan struct{}, pushed func(delta), kick func(via string), ev OverrideEvents)
}

func newOverrides(src overrideSource, ev OverrideEvents) *Overrides {
	o := &Overrides{src: src, ev: ev, kick: make(chan string, 1), stop: make(chan struct{}), done: make(chan struct{}),
		now: time.Now, logged: map[string]uint64{}}
	o.poll.Store(int64(DefaultOverridesPoll))
	return o
}

// NewMemoryOverrides returns overrides kept in this process alone.
func NewMemoryOverrides(ev OverrideEvents) *Overrides {
	return newOverrides(&memoryOverrides{}, ev)
}

// Current is the snapshot in force; nil when there are none.
func (o *Overrides) Current() *OverrideSet {
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
	if err := ov.Check(digest != nil); err != nil {
		return err
	}
	_, d, err := o.src.write(ctx, zone, digest, &ov)
	if err != nil {
		return fmt.Errorf("writing the override: %w", err)
	}
	o.applyOwn(ctx, d)
	return nil
}

// Delete removes zone's override (its key's, when digest is set), and
// says whether there was one.
func (o *Overrides) Delete(ctx context.Context, zone string, digest *[16]byte) (bool, error) {
	found, d, err := o.src.write(ctx, zone, digest, nil)
	if err != nil {
		return false, fmt.Errorf("deleting the override: %w", err)
	}
	o.applyOwn(ctx, d)
	return found, nil
}

// applyOwn puts a change made here in force: from the change itself when
// the snapshot is at its previous version, else by a whole read (which
// may fail: the change is then read at the next push or poll).
func (o *Overrides) applyOwn(ctx context.Context, d delta) {
	o.readMu.Lock()
	cur := o.cur.Load()
	if cur.tokenOf() == d.prev {
		o.install(cur, cur.apply(d.changes, d.next), "change")
		o.readMu.Unlock()
		return
	}
	o.readMu.Unlock()
	_ = o.refresh(ctx, "change", true)
}

// pushed queues a change announced, and wakes the loop.
func (o *Overrides) pushed(d delta) {
	o.pendMu.Lock()
	if !o.full {
		if len(o.pending) >= maxPending {
			o.pending, o.full = nil, true
		} else {
			o.pending = append(o.pending, d)
		}
	}
	o.pendMu.Unlock()
	o.wake("push")
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

// wait is how long until the next poll, or the next expiry if sooner (at
// least expiryGap away).
func (o *Overrides) wait() time.Duration {
	d := time.Duration(o.poll.Load())
	now := o.now()
	if next := o.cur.Load().NextExpiry(now); !next.IsZero() {
		d = min(d, max(next.Sub(now)+time.Millisecond, expiryGap))
	}
	return d
}

// refresh brings the snapshot up to date: from the changes pushed when
// they follow on from it, else from the version and, when it moved (or
// when force), a whole read. The last snapshot stays on an error.
func (o *Overrides) refresh(ctx context.Context, via string, force bool) error {
	o.readMu.Lock()
	defer o.readMu.Unlock()
	cur := o.cur.Load()
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
	}
	o.takePending() // a whole read covers them
	s, err := o.src.load(ctx, o.skipped)
	if err != nil {
		return o.failed(err)
	}
	o.recovered()
	o.install(cur, s, via)
	return nil
}

// install puts s in force in place of cur, without the overrides expired
// by now, and reports it (and the expired ones); nothing when nothing
// changed. The caller holds readMu.
func (o *Overrides) install(cur, s *OverrideSet, via string) {
	now := o.now()
	gone := cur.expired(now)
	if s == cur && len(gone) == 0 {
		return
	}
	s = s.prune(now)
	o.cur.Store(s)
	if t := s.tokenOf(); t != "" {
		o.applied = append(o.applied, t)
		if len(o.applied) > 64 {
			o.applied = o.applied[1:]
		}
	}
	o.ev.OverridesLoaded(s, via, gone)
}

// takePending takes the changes pushed, and whether some were dropped.
func (o *Overrides) takePending() ([]delta, bool) {
	o.pendMu.Lock()
	defer o.pendMu.Unlock()
	p, full := o.pending, o.full
	o.pending, o.full = nil, false
	return p, full
}

// readPushed applies the changes pushed to cur when they follow on from
// it (those already applied skipped), reading their entries; false when
// there are none, or when they do not follow on (a whole read is due).
func (o *Overrides) readPushed(ctx context.Context, cur *OverrideSet) (*OverrideSet, bool, error) {
	pending, full := o.takePending()
	if full || len(pending) == 0 || cur == nil {
		return nil, false, nil
	}
	token, names := cur.token, []string(nil)
	for _, d := range pending {
		switch {
		case d.prev == token:
			token, names = d.next, append(names, d.names...)
		case o.wasApplied(d.next):
		default:
			return nil, false, nil
		}
	}
	if token == cur.token {
		return cur, true, nil
	}
	changes, err := o.src.entries(ctx, names, o.skipped)
	if err != nil {
		return nil, false, err
	}
	return cur.apply(changes, token), true, nil
}

func (o *Overrides) wasApplied(token string) bool {
	for _, t := range o.applied {
		if t == token {
			return true
		}
	}
	return false
}

// skipped reports an entry that cannot be read, once per entry and value
// (at most 1,000 entries remembered). The caller holds readMu.
func (o *Overrides) skipped(entry, value string, err error) {
	h := fnv.New64a()
	h.Write([]byte(value))
	sum := h.Sum64()
	if prev, ok := o.logged[entry]; ok && prev == sum || !ok && len(o.logged) >= 1000 {
		return
	}
	o.logged[entry] = sum
	o.ev.OverrideSkipped(fmt.Sprintf("%.120q", entry), err)
}

func (o *Overrides) failed(err error) error {
	if !o.failing {
		o.failing = true
		o.ev.OverridesFailing(err)
	}
	return err
}

func (o *Overrides) recovered() {
	if o.failing {
		o.failing = false
		o.ev.OverridesFailing(nil)
	}
}

// token is s's version token; "" for the nil set.
func (s *OverrideSet) tokenOf() string {
	if s == nil {
		return ""
	}
	return s.token
}

// Version is the version of the overrides s was read at: a number that
// every change moves on.
func (s *OverrideSet) Version() int64 {
	if s == nil {
		return 0
	}
	return s.version
}

// prune is s without the overrides expired at now (s itself when none
// has).
func (s *OverrideSet) prune(now time.Time) *OverrideSet {
	if len(s.expired(now)) == 0 {
		return s
	}
	n := &OverrideSet{token: s.token, version: s.version, skipped: s.skipped, zones: map[string]Override{}, keys: map[string]*zoneKeys{}}
	for z, o := range s.zones {
		if o.Active(now) {
			n.zones[z] = o
		}
	}
	for z, m := range s.keys {
		k := new(zoneKeys)
		for d, o := range m.all() {
			if o.Active(now) {
				k.put(d, o)
			}
		}
		if k.len() > 0 {
			n.keys[z] = k
		}
	}
	return n
}

// expired lists s's overrides that are no longer in force at now.
func (s *OverrideSet) expired(now time.Time) []OverrideEntry {
	var gone []OverrideEntry
	if s == nil {
		return nil
	}
	for z, o := range s.zones {
		if !o.Active(now) {
			gone = append(gone, OverrideEntry{Zone: z, Override: o})
		}
	}
	for z, m := range s.keys {
		for d, o := range m.all() {
			if !o.Active(now) {
				gone = append(gone, OverrideEntry{Zone: z, Digest: hex.EncodeToString(d[:]), Override: o})
			}
		}
	}
	return gone
}

// memoryOverrides keeps the overrides in this process.
type memoryOverrides struct {
	mu  sync.Mutex
	set *OverrideSet
}

func (m *memoryOverrides) version(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.set.tokenOf(), nil
}

func (m *memoryOverrides) load(context.Context, func(string, string, error)) (*OverrideSet, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.set, nil
}

func (m *memoryOverrides) entries(context.Context, []string, func(string, string, error)) ([]entryChange, error) {
	return nil, errors.New("the memory store's overrides are not pushed")
}

func (m *memoryOverrides) clock(context.Context) (time.Time, error) { return time.Now(), nil }

func (m *memoryOverrides) write(_ context.Context, zone string, digest *[16]byte, o *Override) (bool, delta, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var found bool
	if digest == nil {
		_, found = m.set.Zone(zone)
	} else {
		_, found = m.set.Key(zone, *digest)
	}
	c := entryChange{zone: zone, digest: digest, gone: o == nil}
	if o != nil {
		c.o = *o
	}
	d := delta{prev: m.set.tokenOf(), next: fmt.Sprintf("%d:", m.set.Version()+1), changes: []entryChange{c}}
	for _, e := range m.set.expired(time.Now()) { // dropped, as Redis drops them
		x := entryChange{zone: e.Zone, gone: true}
		if e.Digest != "" {
			dg, _ := ParseDigest(e.Digest)
			x.digest = &dg
		}
		d.changes = append(d.changes, x)
	}
	m.set = m.set.apply(d.changes, d.next)
	return found, d, nil
}

func (m *memoryOverrides) watch(stop <-chan struct{}, _ func(delta), _ func(string), _ OverrideEvents) {
	<-stop
}

// NewRedisOverrides returns the overrides kept in the Redis of client,
// under prefix (the store's key prefix), in database db: see the top of
// this file.
func NewRedisOverrides(client redis.UniversalClient, prefix string, db int, ev OverrideEvents) *Overrides {
	base := prefix + "{overrides}"
	r := &redisOverrides{client: client, hash: base, versionKey: base + ":version", expiry: base + ":expiry",
		channel: base + ":changed"}
	if db != 0 { // channels are not a database's: one of its own
		r.channel += fmt.Sprintf(":db%d", db)
	}
	_, r.cluster = client.(*redis.ClusterClient)
	r.ev = ev
	return newOverrides(r, ev)
}

// redisOverrides keeps the overrides in Redis.
type redisOverrides struct {
	client                            redis.UniversalClient
	hash, versionKey, expiry, channel string
	cluster                           bool
	sharded                           atomic.Int32 // 0: not known yet; 1: yes; 2: no
	quiet                             bool         // tests: changes are not announced
	unannounced                       atomic.Bool  // a change could not be announced (reported once)
	ev                                OverrideEvents
	subscribeTimeout                  time.Duration // default 10s
	scanCount                         int64         // HSCAN's COUNT; default 1000
	afterScan                         func()        // tests: called after each whole read's scan
}

var overridesWrite = redis.NewScript(luascripts.OverridesWrite)

func (r *redisOverrides) version(ctx context.Context) (string, error) {
	s, err := r.client.Get(ctx, r.versionKey).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return s, err
}

func (r *redisOverrides) clock(ctx context.Context) (time.Time, error) {
	return r.client.Time(ctx).Result()
}

// announce is how a change is announced: 0 not at all, 1 on the classic
// channel, 2 on the shard channel too (in a cluster).
func (r *redisOverrides) announce(ctx context.Context) int {
	switch {
	case r.quiet:
		return 0
	case r.cluster: // SPUBLISH too: a node without it (Redis 6) fails it alone (pcall)
		return 2
	}
	return 1
}

func (r *redisOverrides) write(ctx context.Context, zone string, digest *[16]byte, o *Override) (bool, delta, error) {
	name, value, expires := overrideField(zone, digest), "", int64(0)
	if o != nil {
		b, err := json.Marshal(o)
		if err != nil {
			return false, delta{}, err
		}
		value, expires = string(b), o.Expires
	}
	v, err := overridesWrite.Run(ctx, r.client, []string{r.hash, r.versionKey, r.expiry},
		name, value, expires, nonce(), r.announce(ctx), r.channel).Result()
	if err != nil {
		return false, delta{}, err
	}
	reply, ok := v.([]any)
	if !ok || len(reply) < 3 {
		return false, delta{}, fmt.Errorf("%w: overrides write reply %T", errReply, v)
	}
	found, _ := reply[0].(int64)
	d := delta{names: []string{name}}
	d.prev, _ = reply[1].(string)
	d.next, _ = reply[2].(string)
	if len(reply) > 3 {
		if refused, _ := reply[3].(string); refused != "" && r.unannounced.CompareAndSwap(false, true) && r.ev != nil {
			r.ev.OverridesNotPushed(fmt.Errorf("announcing a change: %s", refused))
		}
		reply = append(reply[:3], reply[4:]...)
	}
	c := entryChange{zone: zone, digest: digest, gone: o == nil}
	if o != nil {
		c.o = *o
	}
	d.changes = append(d.changes, c)
	for _, x := range reply[3:] { // the expired entries it dropped
		n, _ := x.(string)
		if z, dg, err := parseOverrideField(n); err == nil {
			d.changes, d.names = append(d.changes, entryChange{zone: z, digest: dg, gone: true}), append(d.names, n)
		}
	}
	return found == 1, d, nil
}

// nonce is a new version's nonce: 8 random bytes, in hex.
func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// shardedChannels reports whether the instances subscribe to the shard
// channel: in a cluster whose nodes know SSUBSCRIBE (Redis 7).
func (r *redisOverrides) shardedChannels(ctx context.Context) bool {
	if !r.cluster {
		return false
	}
	if s := r.sharded.Load(); s != 0 {
		return s == 1
	}
	info, err := r.client.Do(ctx, "COMMAND", "INFO", "SSUBSCRIBE").Slice()
	if err != nil {
		return false // not known yet: the classic channel
	}
	yes := len(info) == 1 && info[0] != nil
	r.sharded.Store(int32(2 - btoi(yes)))
	return yes
}

// load reads the whole hash, in pages (HSCAN), between two readings of
// the version that must agree (else again, at most 3 times: the last
// reading stands, and the next poll corrects it).
func (r *redisOverrides) load(ctx context.Context, skipped func(string, string, error)) (*OverrideSet, error) {
	count, tries := cmp.Or(r.scanCount, 1000), 3
	for try := 1; ; try++ {
		before, err := r.version(ctx)
		if err != nil {
			return nil, err
		}
		var entries []string
		for cursor := uint64(0); ; {
			page, next, err := r.client.HScan(ctx, r.hash, cursor, "", count).Result()
			if err != nil {
				return nil, err
			}
			entries, cursor = append(entries, page...), next
			if cursor == 0 {
				break
			}
		}
		if r.afterScan != nil {
			r.afterScan()
		}
		after, err := r.version(ctx)
		if err != nil {
			return nil, err
		}
		if before == after {
			return parseOverrideEntries(after, entries, skipped), nil
		}
		if try == tries { // changing all along: labelled as no version, so the next poll reads it all again
			return parseOverrideEntries("?"+after, entries, skipped), nil
		}
	}
}

// entries reads the entries named, in one HMGET.
func (r *redisOverrides) entries(ctx context.Context, names []string, skipped func(string, string, error)) ([]entryChange, error) {
	vals, err := r.client.HMGet(ctx, r.hash, names...).Result()
	if err != nil {
		return nil, err
	}
	changes := make([]entryChange, 0, len(names))
	for i, name := range names {
		zone, digest, err := parseOverrideField(name)
		if err != nil {
			skipped(name, "", err)
			continue
		}
		value, ok := vals[i].(string)
		if !ok {
			changes = append(changes, entryChange{zone: zone, digest: digest, gone: true})
			continue
		}
		_, _, o, err := parseOverrideEntry(name, value)
		if err != nil {
			skipped(name, value, err)
			changes = append(changes, entryChange{zone: zone, digest: digest, gone: true})
			continue
		}
		changes = append(changes, entryChange{zone: zone, digest: digest, o: o})
	}
	return changes, nil
}

// parseOverrideEntries builds the set of the entries of the overrides'
// hash (name, JSON, ...) at token, leaving out, and reporting, those it
// cannot read.
func parseOverrideEntries(token string, entries []string, skipped func(string, string, error)) *OverrideSet {
	s := &OverrideSet{token: token, version: tokenVersion(token), zones: map[string]Override{}, keys: map[string]*zoneKeys{}}
	for i := 0; i+1 < len(entries); i += 2 {
		name, value := entries[i], entries[i+1]
		zone, digest, o, err := parseOverrideEntry(name, value)
		if err != nil {
			s.skipped++
			skipped(name, value, err)
			continue
		}
		if digest == nil {
			s.zones[zone] = o
			continue
		}
		if s.keys[zone] == nil {
			s.keys[zone] = new(zoneKeys)
		}
		s.keys[zone].put(*digest, o)
	}
	return s
}

// maxOverrideJSON bounds an override's stored JSON.
const maxOverrideJSON = 4096

// parseOverrideEntry reads an entry. Fields it does not know are ignored
// (a newer version's, during a rolling upgrade): what it knows applies.
func parseOverrideEntry(name, value string) (string, *[16]byte, Override, error) {
	var o Override
	zone, digest, err := parseOverrideField(name)
	if err != nil {
		return "", nil, o, err
	}
	if len(value) > maxOverrideJSON {
		return "", nil, o, fmt.Errorf("value of %d bytes: at most %d", len(value), maxOverrideJSON)
	}
	dec := json.NewDecoder(strings.NewReader(value))
	if err := dec.Decode(&o); err != nil {
		return "", nil, o, fmt.Errorf("value: %s", JSONError(err))
	}
	if dec.More() {
		return "", nil, o, errors.New("value: data after the JSON object")
	}
	if err := o.Check(digest != nil); err != nil {
		return "", nil, o, fmt.Errorf("value: %w", err)
	}
	return zone, digest, o, nil
}

// JSONError describes a JSON decoding error without the data it is about
// (which may hold a client key).
func JSONError(err error) string {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return "malformed JSON: it ends early"
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ")
	case errors.As(err, &syntax):
		return fmt.Sprintf("malformed JSON at byte %d", syntax.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %s: want a %s", typ.Field, typ.Type)
	}
	return "not a JSON object"
}

// parseDelta reads a change's message: "<prev> <next> <names...>".
func parseDelta(payload string) (delta, bool) {
	f := strings.Fields(payload)
	if len(f) < 3 || len(f) > 2+1001 {
		return delta{}, false
	}
	prev := f[0]
	if prev == "-" {
		prev = ""
	}
	return delta{prev: prev, next: f[1], names: f[2:]}, true
}

// watch subscribes to the channel of changes (the shard channel in a
// cluster that has them), queues every change announced, and kicks a read
// on every subscription (go-redis subscribes again after a connection
// drops: what was announced meanwhile is read then), until stop closes. A
// cluster node that loses the channel's slot (a failover, a slot moved)
// ends a shard subscription with a sunsubscribe, which go-redis does not
// make again: watch subscribes again itself. A subscription not confirmed
// within 10s is reported once.
func (r *redisOverrides) watch(stop <-chan struct{}, pushed func(delta), kick func(string), ev OverrideEvents) {
	reported := false
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sharded := r.shardedChannels(ctx)
		cancel()
		if !r.session(stop, sharded, pushed, kick, ev, &reported) {
			return
		}
		select { // a sunsubscribe: again, after a pause
		case <-stop:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// session is one subscription; it reports whether to subscribe again (the
// node ended it), else stop closed.
func (r *redisOverrides) session(stop <-chan struct{}, sharded bool, pushed func(delta), kick func(string), ev OverrideEvents, reported *bool) bool {
	var ps *redis.PubSub
	if sharded {
		ps = r.client.SSubscribe(context.Background(), r.channel)
	} else {
		ps = r.client.Subscribe(context.Background(), r.channel)
	}
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(64))
	confirm := time.NewTimer(cmp.Or(r.subscribeTimeout, 10*time.Second))
	defer confirm.Stop()
	for {
		select {
		case <-stop:
			return false
		case <-confirm.C:
			if !*reported {
				*reported = true
				ev.OverridesNotPushed(fmt.Errorf("no confirmation of the subscription to %s", r.channel))
			}
		case m, ok := <-ch:
			if !ok {
				return false
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "sunsubscribe" || m.Kind == "unsubscribe" {
					kick("subscribe")
					return true
				}
				confirm.Stop()
				kick("subscribe")
			case *redis.Message:
				if d, ok := parseDelta(m.Payload); ok {
					pushed(d)
				} else {
					kick("push")
				}
			}
		}
	}
}
