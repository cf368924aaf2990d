package limiter

// Zones that sync: decided in this process, reconciled with Redis at most
// every interval (Request.Sync), for a fraction of the Redis work of an
// exact zone.
//
// The model. Each instance keeps, per bucket it has seen, an allowance:
// the tokens it may admit on its own until its next sync. At a sync it
// charges Redis's bucket what it admitted since the last one (a charge
// that may go into debt, as count_status's), reads what the bucket holds
// after it, R (less than nothing when the bucket is in debt: the tokens it
// lacks until it is full again, less than its burst), and takes as its new
// allowance its share of it and of what the bucket refills until the next
// sync, max(0, R + rate × interval) / N, where
// N is the number of instances syncing (each registers itself when its
// config loads and at every round, and counts the others seen in the last
// three intervals). A bucket it has not seen starts with a share of a full
// bucket and of its refill. Every
// bucket of the instance that has something to tell (admissions, or a
// refusal for want of allowance, half its allowance spent, or admissions
// that waited ten intervals, ten seconds at least) is synced in one round,
// one batched charge per node (pipelined, joined as exact decisions are):
// a bucket that spends slowly costs Redis one charge per ten seconds, one
// refused or spending fast one per interval.
//
// The bound. Admissions are charged at most one interval late, and each
// instance admits only its share of what it last read and of the refill
// to come: what the fleet admits over any period is at most what the
// exact limit admits over that period and one interval more (rate ×
// interval), plus what instances whose readings did not yet see each
// other's admissions may admit together: at most (N−1)/N of a burst and
// an interval's refill. With N = 3, a burst of 100 and 100r/s, sync
// 100ms: 10 + 73 beyond the exact figure; sync 1s: 100 + 133. The
// overshoot is charged: the bucket goes into debt, and the fleet admits
// nothing more until the debt is repaid, so over a long period the rate
// is exact.
//
// Failure. While a round fails, each instance admits, beyond its
// allowance, what its share of the limit gives (the policy of
// on_store_error local, LocalPolicy(policy, N)), and keeps what it
// admitted to charge (at most a burst) when Redis answers again: no burst
// of admissions follows an outage.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// SyncEvents are told of the syncs' rounds, to count and log.
type SyncEvents interface {
	// Synced: a round of keys buckets took took; err when it failed.
	Synced(keys int, took time.Duration, err error)
}

// maxSyncEntries bounds the buckets an instance keeps allowances of; past
// it, a new bucket gets none until the next round reads it.
const maxSyncEntries = 1 << 20

// chargeAll charges every request its cost (0: a reading), on the
// server's clock, in one batched call per node.
func (s *RedisStore) chargeAll(ctx context.Context, reqs []Request) ([]Decision, error) {
	decisions := make([]Decision, len(reqs))
	idx := make([]int, len(reqs))
	for i := range idx {
		idx[i] = i
	}
	return decisions, s.settle(ctx, "", "charge", reqs, idx, nil, decisions)
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

// syncer keeps the allowances of the buckets of zones that sync.
type syncer struct {
	store    *RedisStore
	memory   *MemoryStore // the buckets of the local share, while rounds fail
	timeout  time.Duration
	id       string
	mu       sync.Mutex
	entries  map[bucketID]*syncEntry
	n        atomic.Int64 // instances syncing, this one included
	failing  atomic.Bool
	every    atomic.Int64 // ns: the shortest interval of the buckets synced
	started  sync.Once
	stop     chan struct{}
	done     chan struct{}
	ev       atomic.Pointer[SyncEvents]
	now      func() time.Time
	regMu    sync.Mutex
	lastSeen time.Time // of the instances' register, under regMu
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
	used      time.Time // last request
	synced    time.Time // last round that read it
}

func newSyncer(store *RedisStore, memory *MemoryStore, timeout time.Duration) *syncer {
	var b [8]byte
	_, _ = rand.Read(b[:])
	s := &syncer{store: store, memory: memory, timeout: timeout, id: hex.EncodeToString(b[:]),
		entries: map[bucketID]*syncEntry{}, stop: make(chan struct{}), done: make(chan struct{}), now: time.Now}
	s.n.Store(1)
	return s
}

// OnSync sets who is told of the rounds.
func (l *Limiter) OnSync(ev SyncEvents) {
	if l.sync != nil {
		l.sync.ev.Store(&ev)
	}
}

// Instances is the number of instances syncing with this one's Redis,
// this one included, as last counted.
func (l *Limiter) Instances() int {
	if l.sync == nil {
		return 1
	}
	return int(l.sync.n.Load())
}

// RegisterSync marks this instance as syncing with its Redis, as a config
// with zones that sync loads, so that the others count it from now.
func (l *Limiter) RegisterSync(ctx context.Context, every time.Duration) {
	if l.sync == nil {
		return
	}
	for {
		cur := l.sync.every.Load()
		if cur != 0 && cur <= int64(every) || l.sync.every.CompareAndSwap(cur, int64(every)) {
			break
		}
	}
	l.sync.register(ctx, time.Now(), true)
}

// CountInstances counts the instances that synced with this one's Redis
// in the last 10 seconds, this one included.
func (l *Limiter) CountInstances(ctx context.Context) int {
	if l.sync == nil {
		return 1
	}
	s := l.sync
	key := s.store.prefix + "{sync}:instances"
	min := fmt.Sprint(time.Now().Add(-10 * time.Second).UnixMilli())
	n, err := s.store.client.ZCount(ctx, key, min, "+inf").Result()
	if err != nil {
		return int(s.n.Load())
	}
	if _, err := s.store.client.ZScore(ctx, key, s.id).Result(); err != nil {
		n++ // this one, not registered yet
	}
	return int(max(n, 1))
}

// held is what a bucket holds as d tells it, negative in debt: its limit
// less the tokens it lacks until it is full again (Reset).
func held(p Policy, d Decision) int64 {
	if d.Limit == 0 || p.Rate <= 0 {
		return d.Remaining
	}
	lack := math.Ceil(float64(d.Reset.Sub(d.At)) / p.Interval())
	return d.Limit - int64(min(max(lack, 0), float64(MaxCost)))
}

// refill is what r's bucket refills in one interval of its sync.
func refill(r Request) int64 {
	p := r.Policy
	if p.Rate <= 0 || p.Period <= 0 {
		return 0
	}
	return int64(float64(p.Rate) * float64(r.Sync) / float64(p.Period))
}

// share is an instance's share of r tokens.
func (s *syncer) share(r int64) int64 { return max(r, 0) / max(s.n.Load(), 1) }

// take decides reqs (all of zones that sync) at now, all or nothing, from
// the allowances; undo gives back what it admitted (another zone of the
// request refused).
func (s *syncer) take(now time.Time, reqs []Request) (d []Decision, undo func()) {
	s.start(reqs)
	s.mu.Lock()
	defer s.mu.Unlock()
	d = make([]Decision, len(reqs))
	es := make([]*syncEntry, len(reqs))
	allowed := true
	for i, r := range reqs {
		e := s.entry(r, now)
		es[i], e.used = e, now
		cost := boundedCost(r.Cost)
		if e.allowance < cost && !(s.failing.Load() && s.localShare(now, r)) {
			allowed, e.wants = false, true
			d[i] = s.refusal(e, cost, now)
			continue
		}
		d[i] = Decision{Allowed: true, Limit: r.Policy.Limit(), Remaining: max(e.remaining-e.spent-cost, 0), Reset: e.reset, At: now}
	}
	if !allowed {
		for i := range d { // none charged: a refusal shows, the others are not asked
			if d[i].Allowed {
				d[i] = Decision{}
			}
		}
		return d, nil
	}
	for i, e := range es {
		cost := boundedCost(reqs[i].Cost)
		e.allowance, e.spent = max(e.allowance-cost, 0), min(e.spent+cost, MaxCost)
	}
	return d, func() { s.giveBack(es, reqs) }
}

// localShare decides r by the instance's share of its limit while rounds
// fail (on_store_error local's policy), and adds to the allowance what it
// admits.
func (s *syncer) localShare(now time.Time, r Request) bool {
	p, err := LocalPolicy(r.Policy, int(max(s.n.Load(), 1)))
	if err != nil {
		return false
	}
	r.Policy = p
	d := s.memory.TakeAt(now, []Request{r})
	if !d[0].Allowed {
		return false
	}
	e := s.entries[bucketIDOf(r)]
	e.allowance += boundedCost(r.Cost)
	e.spent = min(e.spent, e.req.Policy.Limit()) // what is charged once Redis answers: at most a burst
	return true
}

// giveBack undoes a take whose request another zone refused.
func (s *syncer) giveBack(es []*syncEntry, reqs []Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range es {
		cost := boundedCost(reqs[i].Cost)
		e.allowance += cost
		e.spent = max(e.spent-cost, e.sending)
	}
}

// entry is r's entry, made with a share of a full bucket when new; its
// policy is r's. The caller holds mu.
func (s *syncer) entry(r Request, now time.Time) *syncEntry {
	id := bucketIDOf(r)
	e, ok := s.entries[id]
	if !ok {
		limit, allowance := r.Policy.Limit(), s.share(r.Policy.Limit()+refill(r))
		if len(s.entries) >= maxSyncEntries { // a flood of new keys: each waits for a reading
			allowance = 0
		}
		e = &syncEntry{allowance: allowance, granted: allowance, remaining: limit, reset: now, synced: now}
		s.entries[id] = e
	}
	e.req = r
	return e
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
		for {
			cur := s.every.Load()
			if cur != 0 && cur <= int64(r.Sync) || s.every.CompareAndSwap(cur, int64(r.Sync)) {
				break
			}
		}
	}
	s.started.Do(func() { go s.run() })
}

// close stops the rounds.
func (s *syncer) close() {
	close(s.stop)
	started := true
	s.started.Do(func() { started = false; close(s.done) })
	if started {
		<-s.done
	}
}

// run syncs every interval (the shortest of the buckets'), until close.
func (s *syncer) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(time.Duration(max(s.every.Load(), int64(time.Millisecond)))):
		}
		s.round()
	}
}

// round syncs, in one batched charge per node, every bucket whose interval
// has passed and that has something to tell: what it admitted (to charge)
// or a refusal (for a reading); and drops the buckets that are full again
// and idle.
func (s *syncer) round() {
	now := s.now()
	reqs, es := s.due(now)
	if len(reqs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	s.register(ctx, now, false)
	start := time.Now()
	d, err := s.store.chargeAll(ctx, reqs)
	if ev := s.ev.Load(); ev != nil {
		(*ev).Synced(len(reqs), time.Since(start), err)
	}
	s.failing.Store(err != nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range es {
		if err != nil {
			e.sending = 0 // charged next time
			continue
		}
		e.spent -= e.sending
		e.sending = 0
		e.remaining, e.reset, e.synced = d[i].Remaining, d[i].Reset, now
		e.allowance = s.share(held(e.req.Policy, d[i]) + refill(e.req))
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
// whose admissions waited staleAfter. It drops those with nothing to tell
// that were idle for staleAfter and whose bucket is full again.
func (s *syncer) due(now time.Time) ([]Request, []*syncEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var reqs []Request
	var es []*syncEntry
	for id, e := range s.entries {
		interval, since := e.req.Sync, now.Sub(e.synced)
		if since < interval {
			continue
		}
		if e.spent == 0 && !e.wants {
			if !now.Before(e.reset) && now.Sub(e.used) > staleAfter(interval) {
				delete(s.entries, id) // full again and idle: a new entry starts afresh
			}
			continue
		}
		if !e.wants && 2*e.spent < e.granted && since < staleAfter(interval) {
			continue
		}
		r := e.req
		r.Cost, r.ID = e.spent, ""
		e.sending, e.wants = e.spent, false
		reqs, es = append(reqs, r), append(es, e)
	}
	return reqs, es
}

// register marks this instance as syncing and counts the instances seen
// in the last three intervals, at most once per interval (unless force).
func (s *syncer) register(ctx context.Context, now time.Time, force bool) {
	every := time.Duration(s.every.Load())
	s.regMu.Lock()
	if !force && now.Sub(s.lastSeen) < every {
		s.regMu.Unlock()
		return
	}
	s.lastSeen = now
	s.regMu.Unlock()
	key := s.store.prefix + "{sync}:instances"
	p := s.store.client.TxPipeline()
	p.ZAdd(ctx, key, redisZ(float64(now.UnixMilli()), s.id))
	p.ZRemRangeByScore(ctx, key, "-inf", fmt.Sprint(now.Add(-3*every-time.Second).UnixMilli()))
	card := p.ZCard(ctx, key)
	p.PExpire(ctx, key, 10*every+time.Minute)
	if _, err := p.Exec(ctx); err == nil {
		s.n.Store(max(card.Val(), 1))
	}
}
