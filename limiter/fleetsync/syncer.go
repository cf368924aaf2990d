package fleetsync

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
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
// on_store_error local, bucket.InstanceShare(policy, N)), and keeps what it
// admitted to charge (at most a burst) when Redis answers again: no burst
// of admissions follows an outage. A bucket's first request here follows
// on_store_error, as an exact zone's.

// maxSyncEntries bounds the buckets an instance keeps allowances of; past
// it, a new bucket gets none until the next round reads it.
const maxSyncEntries = 1 << 20

// Fleet is where the instances of zones that sync share their buckets:
// Redis (redisstore.Store), or a storage each instance writes its counts to
// (StorageFleet).
type Fleet interface {
	// ChargeAll charges every request its cost (0: a reading) and tells
	// its bucket after, as the fleet counts it; an error that is not
	// MayHaveRun charged nothing.
	ChargeAll(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error)
	// groups splits reqs into the calls of a round: one per group.
	Groups(ctx context.Context, reqs []bucket.Request) [][]int
	// RegisterSync marks the instance id as syncing now and counts those
	// that did within window, id included.
	RegisterSync(ctx context.Context, id string, window time.Duration) (int64, error)
	// CountSync counts the instances that registered within window, id
	// counted whether it did or not; it registers nothing.
	CountSync(ctx context.Context, id string, window time.Duration) (int64, error)
}

// inProcessFleet is a fleet whose ChargeAll is made in this process (the
// storage fleet): readings cost nothing, so the Syncer reads a bucket
// whenever the fleet has news of it, and charges admissions as they are
// made.
type inProcessFleet interface {
	Fleet
	// generation changes whenever the others' counts were read again.
	generation() uint64
	// give takes back what ChargeAll charged reqs, in the windows they
	// were charged in while they last.
	give(reqs []bucket.Request)
	// owns reports whether this instance decides r's bucket's requests
	// that cost more than a share: one instance per bucket.
	owns(r bucket.Request) bool
	// Left is what r's bucket holds as the fleet counts it now.
	Left(r bucket.Request) int64
}

// Syncer keeps the allowances of the buckets of zones that sync.
type Syncer struct {
	fleet     Fleet
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
	ev        atomic.Pointer[Events]
	now       func() time.Time
	floor     atomic.Int64 // on_store_error local's instances, as the last take gave it
	regMu     sync.Mutex   // guards the registrations' times (instances.go)
	lastSeen  time.Time    // the last registration made
	firstReg  time.Time    // the first that succeeded since a gap (warm: see instances.go)
	lastOK    time.Time    // the last that succeeded
	highAt    time.Time    // the last that counted N or more
}

// syncEntry is one bucket's view in this instance.
type syncEntry struct {
	req        bucket.Request // the bucket (zone, key, digest) and its latest policy
	allowance  int64          // tokens this instance may admit until its next sync
	granted    int64          // the allowance as the last sync (or the entry's start) set it
	spent      int64          // admitted since the last sync, to charge
	sending    int64          // of spent, what the round in flight charges
	remaining  int64          // the bucket's, as last read (after this instance's charge)
	reset      time.Time      // when the bucket was full again, as last read
	full       time.Time      // when the bucket is full again, as last read, on this instance's clock
	confirming time.Time      // when a refusal was left to the fleet (confirm); zero once answered
	wants      bool           // refused for want of allowance: wants a reading
	queued     bool           // in the Syncer's queue
	gen        uint64         // an in-process fleet's generation at the last reading
	turns      time.Time      // when the window of the last reading ends (windows); an in-process fleet reads again then
	used       time.Time      // last request
	synced     time.Time      // last round that read it
}

func NewSyncer(f Fleet, memory *memstore.Store, timeout time.Duration) *Syncer {
	var b [8]byte
	_, _ = rand.Read(b[:])
	s := &Syncer{fleet: f, memory: memory, timeout: timeout, id: hex.EncodeToString(b[:]),
		entries: map[bucket.ID]*syncEntry{}, seeding: map[bucket.ID]*seeding{}, stop: make(chan struct{}), done: make(chan struct{}), now: time.Now}
	s.n.Store(1)
	return s
}

// held is what a bucket holds as d tells it, negative in debt: a token
// bucket's limit less the tokens it lacks until it is full again (Reset);
// a window's remaining, which a charge shows negative past the limit.
func held(p bucket.Policy, d bucket.Decision) int64 {
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
func refill(r bucket.Request) int64 {
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
func (s *Syncer) instances(min int) int64 { return max(s.n.Load(), int64(min), 1) }

// What takeOne did with a request.
const (
	tookAllowed = iota // from the entry's allowance (or the local share): the entry is to spend
	tookRefused        // refused
	tookExact          // left to Redis
	tookShared         // decided by the local share without an entry (past maxSyncEntries)
)

// takeOne decides r at now, from its entry's allowance, without spending
// it (see spend); the entry, or nil when it has none. The caller holds mu.
func (s *Syncer) takeOne(now time.Time, r bucket.Request, n int) (*syncEntry, bucket.Decision, int) {
	cost := bucket.BoundedCost(r.Cost)
	ipf, inProcess := s.fleet.(inProcessFleet)
	if !inProcess && !s.warm.Load() { // no share until the fleet is counted
		return nil, bucket.Decision{}, tookExact
	}
	e, ok := s.entries[bucket.IDOf(r)]
	if inProcess && (!ok || e.gen != ipf.generation() || !e.turns.IsZero() && !now.Before(e.turns)) {
		e, ok = s.read(now, r, n, e) // news of the others, or a new window
	}
	if !ok && inProcess { // past maxSyncEntries: the local share
		d, shared := s.shareOnly(now, r, n)
		if shared {
			return nil, d, tookShared
		}
		return nil, d, tookRefused
	}
	over := cost > share(r.Policy.Limit()+refill(r), s.instances(n))
	if !ok || over && !inProcess {
		return nil, bucket.Decision{}, tookExact
	}
	s.update(e, r, n)
	e.used = now
	if !inProcess && !e.turns.IsZero() && !now.Before(e.turns) { // a new window: read at the next round
		e.periodTurned(now, s.instances(n))
		e.turns, e.wants = windowTurns(now, r.Policy), true
		s.flag(e)
	}
	room := e.allowance
	if over { // the bucket's owner decides on the fleet's view, now; the others refuse
		room = 0
		if ipf.owns(r) {
			room = s.room(e)
		}
	}
	if room < cost && !(s.failing.Load() && s.localShare(now, e, r, n)) {
		e.wants = true
		s.flag(e)
		if !inProcess && s.confirm(now, e, cost) {
			return nil, bucket.Decision{}, tookExact
		}
		return nil, s.refusal(e, cost, now), tookRefused
	}
	return e, bucket.Decision{Allowed: true, Limit: r.Policy.Limit(), Remaining: e.allowance - cost, Reset: e.reset, At: now}, tookAllowed
}

// shareOnly decides r, of a bucket the Syncer keeps no entry of (past
// maxSyncEntries), by the instance's share of its limit, in memory.
func (s *Syncer) shareOnly(now time.Time, r bucket.Request, n int) (bucket.Decision, bool) {
	p, err := bucket.InstanceShare(r.Policy, int(s.instances(n)))
	if err != nil {
		return bucket.Decision{Limit: r.Policy.Limit(), RetryAfter: r.Sync, At: now}, false
	}
	r.Policy = p
	d := s.memory.TakeAt(now, []bucket.Request{r})
	return d[0], d[0].Allowed
}

// confirm reports whether a request that e's allowance lacks cost for is
// left to the fleet, to be decided exactly there, rather than refused: a
// share rounds down (remaining / N in whole tokens), so an instance may
// hold none of a bucket that has tokens left. It is when the bucket as
// last read, less what this instance admitted since and plus what it
// refilled since, may hold the cost (else the exact limit refuses it
// too); one request of a bucket at a time (until Seed hears its answer,
// or the timeout passes), never while rounds fail. The fleet's answer is
// a reading (Seed): a bucket found empty is not asked again until it may
// have refilled a token, so a client over its limit costs the fleet at
// most one call per token its rate refills (and none while it is in the
// cache of refused clients). The caller holds mu.
func (s *Syncer) confirm(now time.Time, e *syncEntry, cost int64) bool {
	if s.failing.Load() || !e.confirming.IsZero() && now.Sub(e.confirming) < s.timeout {
		return false
	}
	if e.mayHold(now) < cost {
		return false
	}
	e.confirming = now
	return true
}

// mayHold is the most e's bucket may hold at now, as this instance knows
// it: what it held when last read (a token or leaky bucket's, to the
// fraction of a token: it is full again at full, on this instance's
// clock), plus what it refilled since, less what this instance admitted
// since; a window's count falls only as it turns, or fades (a sliding
// counter may hold anything up to its limit).
func (e *syncEntry) mayHold(now time.Time) int64 {
	p := e.req.Policy
	switch {
	case p.Algorithm == bucket.SlidingWindowCounter, !e.turns.IsZero() && !now.Before(e.turns):
		return p.Limit()
	case !p.Algorithm.Debt() || p.Rate <= 0 || p.Period <= 0 || e.full.IsZero():
		return e.remaining - e.spent
	}
	lack := math.Ceil(float64(e.full.Sub(now)) / p.Interval())
	return p.Limit() - int64(min(max(lack, 0), float64(bucket.MaxCost))) - e.spent
}

// periodTurned starts, when e is a quota whose period has turned since
// its reading, the new period whole: this instance's share of the quota
// (n instances), with nothing of it counted (a reading at the next round
// tells the others' use). What it admitted of the old period and has not
// sent is dropped: the old count went with its key at its end, and the
// new period is not to be charged for it (it would refuse clients within
// their new quota). What is being sent may land in the new period (at
// most a round's). A window carries what went over instead (see
// carry_windows in luascripts/common.lua). The caller holds mu.
func (e *syncEntry) periodTurned(now time.Time, n int64) {
	if e.req.Policy.Algorithm != bucket.Quota || e.turns.IsZero() || now.Before(e.turns) {
		return
	}
	e.spent, e.remaining = e.sending, e.req.Policy.Limit()
	e.allowance = share(e.remaining, n)
	e.granted = e.allowance
}

// refusal is the decision of a request whose cost the allowance lacks:
// the wait until the bucket as last read holds the cost (at least until
// the next round); for a quota, until its period turns.
func (s *Syncer) refusal(e *syncEntry, cost int64, now time.Time) bucket.Decision {
	p := e.req.Policy
	wait := time.Duration(e.req.Sync)
	if p.Algorithm == bucket.Quota {
		wait = max(wait, e.turns.Sub(now))
	} else if short := cost - e.remaining + e.spent; short > 0 && p.Rate > 0 {
		wait = max(wait, time.Duration(float64(short)*p.Interval()))
	}
	return bucket.Decision{Limit: p.Limit(), Reset: e.reset, RetryAfter: wait, At: now}
}

// The fleets.
var _ inProcessFleet = (*StorageFleet)(nil)
