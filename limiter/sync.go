package limiter

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// Zones that sync: decided in this process, reconciled with Redis at most
// every interval (Request.Sync), for a fraction of the Redis work of an
// exact zone.
//
// The model. Each instance keeps, per bucket it has seen, an allowance:
// the tokens it may admit on its own until its next sync. A bucket's first
// request on an instance is decided in Redis, exactly, and its reply
// seeds the entry; so is a request whose cost is more than an instance's
// share (a small burst on many instances), and every request past
// maxSyncEntries entries. At a sync the instance charges Redis's bucket
// what it admitted since the last one (a charge that may go into debt, as
// count_status's), reads what the bucket holds after it, R (less than
// nothing when the bucket is in debt: the tokens it lacks until full, less
// its burst), and takes as its new allowance its share of it and of what
// the bucket refills until the next sync, max(0, R + rate × interval) / N,
// less what it admitted while the round was in flight. N is the number of
// instances registered in the last 10 seconds, on Redis's clock (each
// registers every second from its first request of such a zone: a config
// that only loads, as caddy validate's, registers nothing), at least
// on_store_error local's instances. A policy that changes caps the
// allowance at the new share.
//
// Starting. An instance hands out no share until it has registered twice,
// a second apart (warm): until then every request of a zone that syncs is
// decided in Redis, exactly. A fleet whose instances start together would
// otherwise count itself small: the first to register counts one
// instance, and would take the whole bucket as its share.
//
// A bucket is charged when it was refused for want of allowance, has spent
// half of it, or its admissions waited ten intervals (ten seconds at
// least); the round sends them in batched charges of at most 500 per node
// (pipelined, joined as exact decisions are), each part applied on its
// own: a part that failed without being sent is charged at the next round,
// one that may have run is counted charged (never sent twice). When an
// instance stops, a last round charges what is left.
//
// The windows (fixed, sliding counter) sync as the token bucket does, with
// the window's limit as its burst and no refill in an allowance: what a
// window frees (it turns, or the previous count fades) shows in the next
// reading. A charge counts past the limit, and the reading shows the
// remaining below zero, so that what went over is taken off the next
// allowances; when the window turns, what went over is carried into the
// next window's count (see carry_windows in common.lua), as a token
// bucket's debt outlives its interval: over any period the fleet admits
// the limit of each window it touched and the bound, not the bound in
// every window.
//
// The bound. Each instance admits only its share of what it last read and
// of the refill to come, so what the fleet admits over any period is at
// most what the exact limit admits over that period and one interval
// more (rate × interval), plus what instances whose readings did not yet
// see each other's admissions may admit together: at most (N−1)/N of a
// burst and an interval's refill. With N = 3, a burst of 100 and 100r/s,
// sync 100ms: 10 + 73 beyond the exact figure; sync 1s: 100 + 133. The
// overshoot is charged: the bucket goes into debt, and the fleet admits
// nothing more until the debt is repaid, so over a long period the rate
// is exact. It assumes N right: an instance not yet registered, or whose
// registrations Redis lost, widens it by its share.
//
// Failure. While a round fails, each instance admits, beyond its
// allowance, what its share of the limit gives (the policy of
// on_store_error local, LocalPolicy(policy, N)), and keeps what it
// admitted to charge (at most a burst) when Redis answers again: no burst
// of admissions follows an outage. A bucket's first request here follows
// on_store_error, as an exact zone's.

// SyncEvents are told of the syncs' rounds, to count and log.
type SyncEvents interface {
	// Synced: a round of keys buckets took took; err when it failed.
	Synced(keys int, took time.Duration, err error)
	// InstancesChanged: the instances counted are n now.
	InstancesChanged(n int)
}

// maxSyncEntries bounds the buckets an instance keeps allowances of; past
// it, a new bucket gets none until the next round reads it.
const maxSyncEntries = 1 << 20

// fleet is where the instances of zones that sync share their buckets:
// Redis (RedisStore), or a storage each instance writes its counts to
// (storageFleet).
type fleet interface {
	// ChargeAll charges every request its cost (0: a reading) and tells
	// its bucket after, as the fleet counts it; an error that is not
	// MayHaveRun charged nothing.
	ChargeAll(ctx context.Context, reqs []Request) ([]Decision, error)
	// groups splits reqs into the calls of a round: one per group.
	Groups(ctx context.Context, reqs []Request) [][]int
	// RegisterSync marks the instance id as syncing now and counts those
	// that did within window, id included.
	RegisterSync(ctx context.Context, id string, window time.Duration) (int64, error)
	// CountSync counts the instances that registered within window, id
	// counted whether it did or not; it registers nothing.
	CountSync(ctx context.Context, id string, window time.Duration) (int64, error)
}

// localFleet is a fleet whose ChargeAll is made in this process (the
// storage fleet): readings cost nothing, so the syncer reads a bucket
// whenever the fleet has news of it, and charges admissions as they are
// made.
type localFleet interface {
	fleet
	// generation changes whenever the others' counts were read again.
	generation() uint64
	// give takes back what ChargeAll charged reqs, in the windows they
	// were charged in while they last.
	give(reqs []Request)
	// owns reports whether this instance decides r's bucket's requests
	// that cost more than a share: one instance per bucket.
	owns(r Request) bool
	// left is what r's bucket holds as the fleet counts it now.
	left(r Request) int64
}

// syncer keeps the allowances of the buckets of zones that sync.
type syncer struct {
	fleet     fleet
	memory    *memstore.Store // the buckets of the local share, while rounds fail
	timeout   time.Duration
	id        string
	mu        sync.Mutex
	entries   map[bucket.ID]*syncEntry
	seeding   map[bucket.ID]*seeding // buckets whose first requests are in Redis
	queue     []*syncEntry           // entries that may be due before the next walk (flag)
	walked    time.Time              // the last walk of every entry
	n         atomic.Int64           // instances syncing, this one included
	warm      atomic.Bool            // registered twice: shares may be handed out (see Starting)
	failing   atomic.Bool
	every     atomic.Int64 // ns: the shortest interval of the buckets synced
	started   sync.Once
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
	ev        atomic.Pointer[SyncEvents]
	now       func() time.Time
	floor     atomic.Int64 // on_store_error local's instances, as the last take gave it
	regMu     sync.Mutex   // guards the registrations' times (syncinstances.go)
	lastSeen  time.Time    // the last registration made
	firstReg  time.Time    // the first that succeeded since a gap (warm: see syncinstances.go)
	lastOK    time.Time    // the last that succeeded
	highAt    time.Time    // the last that counted N or more
}

// syncEntry is one bucket's local view.
type syncEntry struct {
	req       Request   // the bucket (zone, key, digest) and its latest policy
	allowance int64     // tokens this instance may admit until its next sync
	granted   int64     // the allowance as the last sync (or the entry's start) set it
	spent     int64     // admitted since the last sync, to charge
	sending   int64     // of spent, what the round in flight charges
	remaining int64     // the bucket's, as last read (after this instance's charge)
	reset     time.Time // when the bucket was full again, as last read
	wants     bool      // refused for want of allowance: wants a reading
	queued    bool      // in the syncer's queue
	gen       uint64    // a local fleet's generation at the last reading
	turns     time.Time // when the window of the last reading ends (windows); a local fleet reads again then
	used      time.Time // last request
	synced    time.Time // last round that read it
}

func newSyncer(f fleet, memory *memstore.Store, timeout time.Duration) *syncer {
	var b [8]byte
	_, _ = rand.Read(b[:])
	s := &syncer{fleet: f, memory: memory, timeout: timeout, id: hex.EncodeToString(b[:]),
		entries: map[bucket.ID]*syncEntry{}, seeding: map[bucket.ID]*seeding{}, stop: make(chan struct{}), done: make(chan struct{}), now: time.Now}
	s.n.Store(1)
	return s
}

// OnSync sets who is told of the rounds.
func (l *Limiter) OnSync(ev SyncEvents) {
	if l.sync != nil {
		l.sync.ev.Store(&ev)
	}
}

// held is what a bucket holds as d tells it, negative in debt: a token
// bucket's limit less the tokens it lacks until it is full again (Reset);
// a window's remaining, which a charge shows negative past the limit.
func held(p Policy, d Decision) int64 {
	if d.Limit == 0 || p.Rate <= 0 || !p.Algorithm.Debt() {
		return d.Remaining
	}
	lack := math.Ceil(float64(d.Reset.Sub(d.At)) / p.Interval())
	return d.Limit - int64(min(max(lack, 0), float64(bucket.MaxCost)))
}

// refill is what r's bucket refills in one interval of its sync: none
// for a window, whose count falls only as it turns (a fixed window) or as
// the previous window's count fades (the sliding counter), which the next
// reading shows.
func refill(r Request) int64 {
	p := r.Policy
	if p.Rate <= 0 || p.Period <= 0 || !p.Algorithm.Debt() {
		return 0
	}
	return int64(float64(p.Rate) * float64(r.Sync) / float64(p.Period))
}

// share is an instance's share of r tokens among n instances.
func share(r, n int64) int64 { return max(r, 0) / max(n, 1) }

// instances is the number of instances a share is of: those counted, at
// least the fleet on_store_error local names (min).
func (s *syncer) instances(min int) int64 { return max(s.n.Load(), int64(min), 1) }

// take decides reqs (all of zones that sync) at now, all or nothing among
// those it decides, from the allowances; n is the least number of
// instances to share among. exact lists the requests it leaves to Redis
// (their decisions are zero): a bucket this instance has no entry of (its
// first request reads Redis, which seeds the entry: see seed), a cost
// over the share, or no room for a new entry. undo gives back what it
// admitted (another zone of the request refused); nil when it refused.
func (s *syncer) take(now time.Time, reqs []Request, n int) (d []Decision, exact []int, undo func()) {
	s.start(reqs)
	s.floor.Store(int64(n))
	s.mu.Lock()
	defer s.mu.Unlock()
	d = make([]Decision, len(reqs))
	es := make([]*syncEntry, len(reqs))
	allowed := true
	for i, r := range reqs {
		var how int
		es[i], d[i], how = s.takeOne(now, r, n)
		switch how {
		case tookExact:
			exact = append(exact, i)
		case tookRefused:
			allowed = false
		}
	}
	if !allowed {
		for i := range d { // none charged: a refusal shows, the others are not asked
			if d[i].Allowed {
				d[i] = Decision{}
			}
		}
		return d, nil, nil
	}
	charged := s.spend(reqs, es)
	for _, i := range exact { // the first requests of a bucket in flight: seed waits for the last
		if id := bucket.IDOf(reqs[i]); s.entries[id] == nil {
			if s.seeding[id] == nil {
				s.seeding[id] = &seeding{}
			}
			s.seeding[id].n++
		}
	}
	return d, exact, func() { s.giveBack(es, reqs, charged) }
}

// What takeOne did with a request.
const (
	tookAllowed = iota // from the entry's allowance (or the local share): the entry is to spend
	tookRefused        // refused
	tookExact          // left to Redis
	tookShared         // decided by the local share without an entry (past maxSyncEntries)
)

// takeOne decides r at now, from its entry's allowance, without spending
// it (see spend); the entry, or nil when it has none. The caller holds mu.
func (s *syncer) takeOne(now time.Time, r Request, n int) (*syncEntry, Decision, int) {
	cost := bucket.BoundedCost(r.Cost)
	lf, local := s.fleet.(localFleet)
	if !local && !s.warm.Load() { // no share until the fleet is counted
		return nil, Decision{}, tookExact
	}
	e, ok := s.entries[bucket.IDOf(r)]
	if local && (!ok || e.gen != lf.generation() || !e.turns.IsZero() && !now.Before(e.turns)) {
		e, ok = s.read(now, r, n, e) // news of the others, or a new window
	}
	if !ok && local { // past maxSyncEntries: the local share
		d, shared := s.shareOnly(now, r, n)
		if shared {
			return nil, d, tookShared
		}
		return nil, d, tookRefused
	}
	over := cost > share(r.Policy.Limit()+refill(r), s.instances(n))
	if !ok || over && !local {
		return nil, Decision{}, tookExact
	}
	s.update(e, r, n)
	e.used = now
	if !local && !e.turns.IsZero() && !now.Before(e.turns) { // a new window: read at the next round
		e.turns, e.wants = windowTurns(now, r.Policy), true
		s.flag(e)
	}
	room := e.allowance
	if over { // the bucket's owner decides on the fleet's view, now; the others refuse
		room = 0
		if lf.owns(r) {
			room = s.room(e)
		}
	}
	if room < cost && !(s.failing.Load() && s.localShare(now, e, r, n)) {
		e.wants = true
		s.flag(e)
		return nil, s.refusal(e, cost, now), tookRefused
	}
	return e, Decision{Allowed: true, Limit: r.Policy.Limit(), Remaining: e.allowance - cost, Reset: e.reset, At: now}, tookAllowed
}

// spend takes what reqs cost from their entries es (nil: none), charging a
// local fleet at once; it reports whether it did (else the rounds charge
// it). The caller holds mu.
func (s *syncer) spend(reqs []Request, es []*syncEntry) bool {
	_, local := s.fleet.(localFleet)
	charged := local && s.chargeNow(reqs, es)
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

// chargeNow charges a local fleet what the take of reqs admitted (the
// entries es), as it is admitted: its window is the one it counts in, and
// the others see it at this instance's next write. False when the fleet
// failed (charged nothing: the rounds charge it).
func (s *syncer) chargeNow(reqs []Request, es []*syncEntry) bool {
	var charge []Request
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

// shareOnly decides r, of a bucket the syncer keeps no entry of (past
// maxSyncEntries), by the instance's share of its limit, in memory.
func (s *syncer) shareOnly(now time.Time, r Request, n int) (Decision, bool) {
	p, err := LocalPolicy(r.Policy, int(s.instances(n)))
	if err != nil {
		return Decision{Limit: r.Policy.Limit(), RetryAfter: r.Sync, At: now}, false
	}
	r.Policy = p
	d := s.memory.TakeAt(now, []Request{r})
	return d[0], d[0].Allowed
}

// read makes the entry of r's bucket from a reading of a local fleet
// (nothing charged), or gives old, its entry, a new allowance from one;
// false past maxSyncEntries, or when the fleet cannot tell. The caller
// holds mu.
func (s *syncer) read(now time.Time, r Request, n int, old *syncEntry) (*syncEntry, bool) {
	if old == nil && len(s.entries) >= maxSyncEntries {
		return nil, false
	}
	gen := s.fleet.(localFleet).generation()
	if count, err := s.fleet.RegisterSync(context.Background(), s.id, instancesWindow); err == nil { // counted in memory
		if old := s.n.Swap(max(count, 1)); old != max(count, 1) {
			if ev := s.ev.Load(); ev != nil {
				(*ev).InstancesChanged(int(max(count, 1)))
			}
		}
	}
	reading := r
	reading.Cost, reading.ID, reading.Key = 0, "", ""
	d, err := s.fleet.ChargeAll(context.Background(), []Request{reading})
	if err == nil && d[0].Limit == 0 {
		return nil, false
	}
	s.failing.Store(err != nil) // a local fleet tells at once
	e := old
	if e == nil {
		e = &syncEntry{req: reading, used: now}
		s.entries[bucket.IDOf(r)] = e
	}
	if err != nil { // the fleet cannot tell: the local share, and a reading at the next round
		e.wants = true
		s.flag(e)
		return e, true
	}
	e.synced, e.gen, e.turns = now, gen, windowTurns(now, r.Policy)
	a := max(share(held(r.Policy, d[0])+refill(r), s.instances(n))-e.spent, 0)
	e.allowance, e.granted, e.remaining, e.reset = a, a, d[0].Remaining, d[0].Reset
	return e, true
}

// windowTurns is when the window of p that holds now ends (windows start
// at multiples of their length since the Unix epoch); zero for the other
// algorithms.
func windowTurns(now time.Time, p Policy) time.Time {
	if p.Algorithm != FixedWindow && p.Algorithm != SlidingWindowCounter || p.Period <= 0 {
		return time.Time{}
	}
	ns, w := now.UnixNano(), int64(p.Period)
	return time.Unix(0, ns-ns%w+w)
}

// room is what e's bucket holds, as a local fleet counts it now, less what
// this instance admitted since its last round: a cost over the share is
// decided on it. The caller holds mu.
func (s *syncer) room(e *syncEntry) int64 {
	return s.fleet.(localFleet).left(e.req) - e.spent
}

// seeding is a bucket whose first requests here are in Redis: n of them,
// best the answer read last in Redis (its latest At; of one At, a batched
// call's, the least remaining), which counts all the others' charges made
// before it.
type seeding struct {
	n    int
	best Decision
	req  Request
}

// update gives e r's policy: a policy changed (a reload, an override, a
// placeholder) caps the allowance at the new share and asks for a
// reading. The caller holds mu.
func (s *syncer) update(e *syncEntry, r Request, n int) {
	if e.req.Policy != r.Policy || e.req.Sync != r.Sync {
		e.allowance = min(e.allowance, share(r.Policy.Limit()+refill(r), s.instances(n)))
		e.wants = true
		s.flag(e)
	}
	r.Key = "" // only the digest is kept
	e.req = r
}

// seed takes the exact decision d of r, a request take left to Redis (a
// zero d: not decided there). For a bucket's first requests here, the
// entry is made when the last of those in flight is answered, from the
// answer read last in Redis, which counts the others' charges before it:
// the bucket as Redis told it, and the share of it (nothing to charge).
// For a bucket that has an entry (a cost over the share), the allowance
// loses the cost Redis charged. No entry past maxSyncEntries.
func (s *syncer) seed(r Request, d Decision, now time.Time, n int) {
	if now.IsZero() {
		now = s.now()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := bucket.IDOf(r)
	if e, ok := s.entries[id]; ok {
		if d.Allowed { // owed (below zero) if the allowance is spent already
			e.allowance -= bucket.BoundedCost(r.Cost)
		}
		return
	}
	sd := s.seeding[id]
	if sd == nil {
		return
	}
	later := d.At.After(sd.best.At) || d.At.Equal(sd.best.At) && d.Remaining < sd.best.Remaining // one batched call: one time
	if d.Limit != 0 && !d.At.IsZero() && later {
		sd.best, sd.req = d, r
	}
	if sd.n--; sd.n > 0 {
		return
	}
	delete(s.seeding, id)
	if sd.best.Limit == 0 || len(s.entries) >= maxSyncEntries || !s.warm.Load() {
		return // none decided by Redis (a fallback), or the fleet not counted yet: the next request reads it
	}
	r, d = sd.req, sd.best
	r.Key = ""
	a := share(held(r.Policy, d)+refill(r), s.instances(n))
	s.entries[id] = &syncEntry{req: r, allowance: a, granted: a, remaining: d.Remaining, reset: d.Reset, synced: now, used: now,
		turns: windowTurns(now, r.Policy)}
}

// localShare decides r by the instance's share of its limit while rounds
// fail (on_store_error local's policy), and adds to the allowance what it
// admits. The caller holds mu.
func (s *syncer) localShare(now time.Time, e *syncEntry, r Request, n int) bool {
	p, err := LocalPolicy(r.Policy, int(s.instances(n)))
	if err != nil {
		return false
	}
	r.Policy = p
	d := s.memory.TakeAt(now, []Request{r})
	if !d[0].Allowed {
		return false
	}
	e.allowance += bucket.BoundedCost(r.Cost)
	e.spent = max(min(e.spent, e.req.Policy.Limit()), e.sending) // charged once Redis answers: at most a burst
	return true
}

// giveBack undoes a take whose request another zone refused; charged:
// the take charged a local fleet at once.
func (s *syncer) giveBack(es []*syncEntry, reqs []Request, charged bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var give []Request
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
		s.fleet.(localFleet).give(give)
	}
}

// refusal is the decision of a request whose cost the allowance lacks:
// the wait until the bucket as last read holds the cost (at least until
// the next round).
func (s *syncer) refusal(e *syncEntry, cost int64, now time.Time) Decision {
	p := e.req.Policy
	wait := time.Duration(e.req.Sync)
	if short := cost - e.remaining + e.spent; short > 0 && p.Rate > 0 {
		wait = max(wait, time.Duration(float64(short)*p.Interval()))
	}
	return Decision{Limit: p.Limit(), Reset: e.reset, RetryAfter: wait, At: now}
}

// start starts the rounds, once, and makes them as frequent as the
// shortest interval of reqs.
func (s *syncer) start(reqs []Request) {
	for _, r := range reqs {
		s.atMost(r.Sync)
	}
	s.started.Do(func() { go s.run() })
}

// atMost makes the rounds at least as frequent as every d.
func (s *syncer) atMost(d time.Duration) {
	for {
		cur := s.every.Load()
		if cur != 0 && cur <= int64(d) || s.every.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// close stops the rounds, after a last one that charges what is left to
// charge. Safe to call more than once.
func (s *syncer) close() {
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
func (s *syncer) run() {
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
func (s *syncer) round(final bool) {
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
		d, err := s.fleet.ChargeAll(ctx, pick(reqs, part))
		failed = cmp.Or(failed, err)
		s.settled(now, part, es, d, err)
	}
	if ev := s.ev.Load(); ev != nil {
		(*ev).Synced(len(reqs), time.Since(start), failed)
	}
	s.failing.Store(failed != nil)
}

// settled applies a part's charge: the readings, and the new allowances
// (less what was admitted while the round was in flight).
func (s *syncer) settled(now time.Time, part []int, es []*syncEntry, d []Decision, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for j, i := range part {
		e := es[i]
		switch {
		case err != nil && !redisstore.MayHaveRun(err):
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
		e.remaining, e.reset, e.synced, e.turns = d[j].Remaining, d[j].Reset, now, windowTurns(now, e.req.Policy)
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
func (s *syncer) due(now time.Time, final bool) ([]Request, []*syncEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var reqs []Request
	var es []*syncEntry
	charge := func(e *syncEntry) {
		r := e.req
		r.Cost, r.ID = e.spent, ""
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

// What a round does with an entry (verdict).
const (
	dueNot   = iota // nothing to charge yet
	dueNow          // charge and read it
	dueLater        // it was synced less than an interval ago
	dueIdle         // nothing to charge or read
)

// verdict is what a round at now does with e (see due). The caller holds
// mu.
func (s *syncer) verdict(e *syncEntry, now time.Time, final bool) int {
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
func (s *syncer) flag(e *syncEntry) {
	if !e.queued {
		e.queued = true
		s.queue = append(s.queue, e)
	}
}
