package limiter

// Keeping the overrides current. Overrides holds the snapshot in force,
// read by every request with one atomic load, and replaces it when the
// overrides change:
//
//   - with the memory store, they live in this process: a change is the
//     new snapshot;
//   - with Redis, they live in three keys under the store's prefix, in one
//     hash slot: "{overrides}" (a hash: entry name -> JSON), its version
//     "{overrides}:version" (a counter moved on by every change), and the
//     expiries "{overrides}:expiry" (a sorted set, so that a change drops
//     the expired entries without reading them all). A change is written
//     by one script and announced on the channel "{overrides}:changed";
//     every instance subscribed reads the new version at once.
//
// An instance also reads the version every poll interval, so that a
// message missed (a dropped subscription, a restart, a partition) heals on
// its own; it reads the whole set only when the version moved. Reads are
// serialised (one at a time, the last one wins), pushes arriving while one
// runs coalesce into the next, and while Redis cannot be read the last
// snapshot stays in force. A malformed or foreign entry is left out, and
// reported; it never stops the others from loading.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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

// minRefreshGap spaces the reads that pushes cause: a burst of changes is
// read once or twice, not once per change.
const minRefreshGap = 100 * time.Millisecond

// OverrideEvents is told what happens to the overrides, to log and count.
type OverrideEvents interface {
	// OverridesLoaded: s is in force from now on, read because of via
	// ("start", "reload", "push", "subscribe", "poll", "change", or
	// "expiry"); expired are the overrides of the last snapshot that
	// expired since.
	OverridesLoaded(s *OverrideSet, via string, expired []OverrideEntry)
	// OverrideSkipped: an entry could not be read; it is left out.
	OverrideSkipped(entry string, err error)
	// OverridesFailing: reading them failed (err), the last ones read
	// staying in force; or, with a nil err, reading works again. Called
	// on each change between the two.
	OverridesFailing(err error)
}

// Overrides holds the overrides in force and keeps them current (see the
// top of this file). Its methods are safe for concurrent use.
type Overrides struct {
	cur     atomic.Pointer[OverrideSet]
	src     overrideSource
	ev      OverrideEvents
	poll    atomic.Int64 // ns
	kick    chan string  // coalesced pushes
	stop    chan struct{}
	done    chan struct{}
	start   sync.Once
	close   sync.Once
	readMu  sync.Mutex // one read at a time
	failing bool       // under readMu
	now     func() time.Time
}

// overrideSource is where overrides live.
type overrideSource interface {
	version(ctx context.Context) (int64, error)
	load(ctx context.Context, skipped func(entry string, err error)) (*OverrideSet, error)
	// write sets zone's override (its key's when digest is set) to o, or
	// deletes it when o is nil, and says whether there was one.
	write(ctx context.Context, zone string, digest *[16]byte, o *Override, now time.Time) (found bool, err error)
	// watch calls kick on every push until stop closes.
	watch(stop <-chan struct{}, kick func(via string))
}

func newOverrides(src overrideSource, ev OverrideEvents) *Overrides {
	o := &Overrides{src: src, ev: ev, kick: make(chan string, 1), stop: make(chan struct{}), done: make(chan struct{}), now: time.Now}
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

// SetPoll sets how often the version is read (at least 100ms).
func (o *Overrides) SetPoll(d time.Duration) {
	o.poll.Store(int64(max(d, minRefreshGap)))
	o.push("poll")
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
// other instances read it on its push, or at their next poll.
func (o *Overrides) Put(ctx context.Context, zone string, digest *[16]byte, ov Override) error {
	if err := ov.Check(digest != nil); err != nil {
		return err
	}
	if _, err := o.src.write(ctx, zone, digest, &ov, o.now()); err != nil {
		return fmt.Errorf("writing the override: %w", err)
	}
	return o.refresh(ctx, "change", true)
}

// Delete removes zone's override (its key's, when digest is set), and
// says whether there was one.
func (o *Overrides) Delete(ctx context.Context, zone string, digest *[16]byte) (bool, error) {
	found, err := o.src.write(ctx, zone, digest, nil, o.now())
	if err != nil {
		return false, fmt.Errorf("deleting the override: %w", err)
	}
	return found, o.refresh(ctx, "change", true)
}

// push asks the background loop for a read, coalesced with any pending.
func (o *Overrides) push(via string) {
	select {
	case o.kick <- via:
	default:
	}
}

// run reads the version on every push, every poll interval, and at the
// next expiry (to report the overrides in force), until Close.
func (o *Overrides) run() {
	defer close(o.done)
	watching := make(chan struct{})
	go func() { o.src.watch(o.stop, o.push); close(watching) }()
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
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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

// wait is how long until the next poll, or the next expiry if sooner.
func (o *Overrides) wait() time.Duration {
	d := time.Duration(o.poll.Load())
	now := o.now()
	if next := o.cur.Load().NextExpiry(now); !next.IsZero() {
		d = min(d, next.Sub(now)+time.Millisecond)
	}
	return max(d, time.Millisecond)
}

// refresh reads the version, and the overrides when it moved (or when
// force). The last snapshot stays in force on an error. Overrides expired
// since the last snapshot leave the new one, and are reported.
func (o *Overrides) refresh(ctx context.Context, via string, force bool) error {
	o.readMu.Lock()
	defer o.readMu.Unlock()
	cur := o.cur.Load()
	s := cur
	if !force {
		v, err := o.src.version(ctx)
		if err != nil {
			return o.failed(err)
		}
		if cur == nil || v != cur.Version() {
			force = true
		}
	}
	if force {
		var err error
		if s, err = o.src.load(ctx, o.ev.OverrideSkipped); err != nil {
			return o.failed(err)
		}
	} else {
		via = "expiry"
	}
	o.recovered()
	now := o.now()
	gone := cur.expired(now)
	if s == cur && len(gone) == 0 {
		return nil
	}
	s = s.prune(now)
	o.cur.Store(s)
	o.ev.OverridesLoaded(s, via, gone)
	return nil
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

// memoryOverrides keeps the overrides in this process.
type memoryOverrides struct {
	mu  sync.Mutex
	set *OverrideSet
}

func (m *memoryOverrides) version(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.set == nil {
		return 0, nil
	}
	return m.set.Version(), nil
}

func (m *memoryOverrides) load(context.Context, func(string, error)) (*OverrideSet, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.set, nil
}

func (m *memoryOverrides) write(_ context.Context, zone string, digest *[16]byte, o *Override, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var found bool
	if digest == nil {
		_, found = m.set.Zone(zone)
	} else {
		_, found = m.set.Key(zone, *digest)
	}
	m.set = m.set.with(zone, digest, o, m.set.Version()+1).prune(now)
	return found, nil
}

func (m *memoryOverrides) watch(stop <-chan struct{}, _ func(string)) { <-stop }

// Version is the version of the overrides s was read at.
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
	n := &OverrideSet{version: s.version, skipped: s.skipped, zones: map[string]Override{}, keys: map[string]map[[16]byte]Override{}}
	for z, o := range s.zones {
		if o.Active(now) {
			n.zones[z] = o
		}
	}
	for z, m := range s.keys {
		k := make(map[[16]byte]Override, len(m))
		for d, o := range m {
			if o.Active(now) {
				k[d] = o
			}
		}
		if len(k) > 0 {
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
		for d, o := range m {
			if !o.Active(now) {
				gone = append(gone, OverrideEntry{Zone: z, Digest: hex.EncodeToString(d[:]), Override: o})
			}
		}
	}
	return gone
}

// NewRedisOverrides returns the overrides kept in the Redis of client,
// under prefix (the store's key prefix): see the top of this file.
func NewRedisOverrides(client redis.UniversalClient, prefix string, ev OverrideEvents) *Overrides {
	base := prefix + "{overrides}"
	r := &redisOverrides{client: client, hash: base, version_: base + ":version", expiry: base + ":expiry",
		channel: base + ":changed", publish: true}
	_, r.cluster = client.(*redis.ClusterClient)
	return newOverrides(r, ev)
}

// redisOverrides keeps the overrides in Redis.
type redisOverrides struct {
	client                          redis.UniversalClient
	hash, version_, expiry, channel string
	cluster                         bool
	sharded                         atomic.Int32 // 0: not known yet; 1: yes; 2: no
	publish                         bool         // tests turn the pushes off
}

var (
	overridesWrite = redis.NewScript(luascripts.OverridesWrite)
	overridesRead  = redis.NewScript(luascripts.OverridesRead)
)

func (r *redisOverrides) version(ctx context.Context) (int64, error) {
	s, err := r.client.Get(ctx, r.version_).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("overrides version %.40q: not a number", s)
	}
	return v, nil
}

func (r *redisOverrides) write(ctx context.Context, zone string, digest *[16]byte, o *Override, now time.Time) (bool, error) {
	field, value, expires := overrideField(zone, digest), "", int64(0)
	if o != nil {
		b, err := json.Marshal(o)
		if err != nil {
			return false, err
		}
		value, expires = string(b), o.Expires
	}
	v, err := overridesWrite.Run(ctx, r.client, []string{r.hash, r.version_, r.expiry}, field, value, expires, now.UnixMilli()).Result()
	if err != nil {
		return false, err
	}
	ints, err := replyInts(v, 2)
	if err != nil {
		return false, err
	}
	if r.publish {
		r.announce(ctx, ints[1])
	}
	return ints[0] == 1, nil
}

// announce publishes a new version: on the classic channel, which every
// node of a cluster forwards, and, in a cluster whose nodes have it, on
// the shard channel, which the instances subscribe to there. A lost
// message is healed by the poll.
func (r *redisOverrides) announce(ctx context.Context, version int64) {
	msg := strconv.FormatInt(version, 10)
	_ = r.client.Publish(ctx, r.channel, msg).Err()
	if r.shardedChannels(ctx) {
		_ = r.client.SPublish(ctx, r.channel, msg).Err()
	}
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

func (r *redisOverrides) load(ctx context.Context, skipped func(string, error)) (*OverrideSet, error) {
	v, err := overridesRead.Run(ctx, r.client, []string{r.hash, r.version_}).Result()
	if err != nil {
		return nil, err
	}
	reply, ok := v.([]any)
	if !ok || len(reply) != 2 {
		return nil, fmt.Errorf("overrides: unexpected reply %T", v)
	}
	vs, _ := reply[0].(string)
	version, err := strconv.ParseInt(vs, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("overrides version %.40q: not a number", vs)
	}
	entries, ok := reply[1].([]any)
	if !ok || len(entries)%2 != 0 {
		return nil, fmt.Errorf("overrides: unexpected entries %T", reply[1])
	}
	return parseOverrideEntries(version, entries, skipped), nil
}

// parseOverrideEntries builds the set of the entries of the overrides'
// hash (name, JSON, ...), leaving out, and reporting, those it cannot read.
func parseOverrideEntries(version int64, entries []any, skipped func(string, error)) *OverrideSet {
	s := &OverrideSet{version: version, zones: map[string]Override{}, keys: map[string]map[[16]byte]Override{}}
	for i := 0; i < len(entries); i += 2 {
		name, _ := entries[i].(string)
		value, _ := entries[i+1].(string)
		zone, digest, o, err := parseOverrideEntry(name, value)
		if err != nil {
			s.skipped++
			skipped(fmt.Sprintf("%.120q", name), err)
			continue
		}
		if digest == nil {
			s.zones[zone] = o
			continue
		}
		if s.keys[zone] == nil {
			s.keys[zone] = map[[16]byte]Override{}
		}
		s.keys[zone][*digest] = o
	}
	return s
}

// maxOverrideJSON bounds an override's stored JSON.
const maxOverrideJSON = 4096

func parseOverrideEntry(name, value string) (string, *[16]byte, Override, error) {
	var o Override
	zone, digest, err := parseOverrideField(name)
	if err != nil {
		return "", nil, o, err
	}
	if len(value) > maxOverrideJSON {
		return "", nil, o, fmt.Errorf("value of %d bytes: at most %d", len(value), maxOverrideJSON)
	}
	if err := strictJSON(value, &o); err != nil {
		return "", nil, o, fmt.Errorf("value: %w", err)
	}
	if err := o.Check(digest != nil); err != nil {
		return "", nil, o, fmt.Errorf("value: %w", err)
	}
	return zone, digest, o, nil
}

// strictJSON decodes s into v, refusing unknown fields and trailing data.
func strictJSON(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON object")
	}
	return nil
}

// watch subscribes to the channel of changes (the shard channel in a
// cluster that has them) and calls kick on every message, and on every
// subscription (go-redis subscribes again after a connection drops: what
// was published meanwhile is read then), until stop closes.
func (r *redisOverrides) watch(stop <-chan struct{}, kick func(string)) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	sharded := r.shardedChannels(ctx)
	cancel()
	var ps *redis.PubSub
	if sharded {
		ps = r.client.SSubscribe(context.Background(), r.channel)
	} else {
		ps = r.client.Subscribe(context.Background(), r.channel)
	}
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(16))
	for {
		select {
		case <-stop:
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			switch m.(type) {
			case *redis.Subscription:
				kick("subscribe")
			case *redis.Message:
				kick("push")
			}
		}
	}
}
