package limiter

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// Call is one store call of a Verdict: the enforced zones' or the dry-run
// zones'.
type Call struct {
	// Store is where it was decided ("memory" or "redis"); "" when no
	// store was called (a ban, the cache of refused clients).
	Store string
	// Took is how long the store call took.
	Took time.Duration
	// Failure is why the store did not decide, and Err its error; the
	// fallback decided then.
	Failure Failure
	Err     error
}

// Decide decides reqs at now into v, whose slices it reuses: a ban
// refuses at once; else the store charges every enforced zone, all or
// nothing, and the dry-run zones apart (before them). When the store
// fails, c's fallback decides. The zero now is the wall clock. Decide
// keeps no reference to reqs once it returns, but in v (its Requests, and
// the take of the zones that sync, which v's Reset drops): what outlives
// it (slots to renew or release) is copied, so the caller may reuse reqs
// as soon as it is done with v. Requests whose dry-run ones come last are
// decided without copies. A caller without Events is told nothing.
func (l *Limiter) Decide(ctx context.Context, now time.Time, reqs []Request, c Caller, v *Verdict) {
	if c.Events == nil {
		c.Events = noEvents{}
	}
	if l.regions != nil && anyGlobal(reqs) {
		l.decideGlobal(ctx, now, reqs, c, v)
		return
	}
	l.decide(ctx, now, reqs, c, v)
}

// decide is Decide without regions.
func (l *Limiter) decide(ctx context.Context, now time.Time, reqs []Request, c Caller, v *Verdict) {
	v.States = v.States[:0]
	for range reqs {
		v.States = append(v.States, NotAsked)
	}
	v.Requests, v.Decisions, v.Calls, v.release = reqs, nil, [2]Call{}, nil
	if l.redis == nil && cap(v.room.decisions) < len(reqs) { // the memory store's, kept by Reset
		v.room.decisions = make([]Decision, len(reqs))
	}
	n := 0 // the enforced requests before the first dry-run one
	for n < len(reqs) && !reqs[n].DryRun {
		n++
	}
	for _, r := range reqs[n:] {
		if !r.DryRun {
			l.decideApart(ctx, now, reqs, c, v)
			return
		}
	}
	switch n {
	case len(reqs):
		v.Decisions, v.release = l.decidePart(ctx, now, reqs, c, v.States, &v.Calls[0], &v.room)
	case 0:
		v.Decisions, v.release = l.decidePart(ctx, now, reqs, c, v.States, &v.Calls[1], &v.room)
	default:
		dry, dryRelease := l.decidePart(ctx, now, reqs[n:], c, v.States[n:], &v.Calls[1], nil)
		enforced, release := l.decidePart(ctx, now, reqs[:n], c, v.States[:n], &v.Calls[0], nil)
		v.Decisions = make([]Decision, len(reqs))
		copy(v.Decisions, enforced)
		copy(v.Decisions[n:], dry)
		v.release = both(release, dryRelease)
	}
}

// decideApart is Decide for requests whose dry-run ones are anywhere: it
// decides the dry-run ones, then the others, and puts their states and
// decisions back in the order of reqs.
func (l *Limiter) decideApart(ctx context.Context, now time.Time, reqs []Request, c Caller, v *Verdict) {
	var parts [2][]Request
	var at [2][]int
	for i, r := range reqs {
		p := 0
		if r.DryRun {
			p = 1
		}
		parts[p], at[p] = append(parts[p], r), append(at[p], i)
	}
	v.Decisions = make([]Decision, len(reqs))
	var releases [2]func()
	for _, p := range [2]int{1, 0} { // the dry-run zones first
		states := make([]State, len(parts[p]))
		var d []Decision
		d, releases[p] = l.decidePart(ctx, now, parts[p], c, states, &v.Calls[p], nil)
		for j, i := range at[p] {
			v.States[i] = states[j]
			if j < len(d) {
				v.Decisions[i] = d[j]
			}
		}
	}
	v.release = both(releases[0], releases[1])
}

// both is a release that calls a and b; nil when both are.
func both(a, b func()) func() {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func() { a(); b() }
}

// decidePart decides reqs, all enforced or all dry-run, setting states and
// call; it returns the decisions and the release of the slots taken. The
// stores write their decisions in room when it is not nil (see take).
func (l *Limiter) decidePart(ctx context.Context, now time.Time, reqs []Request, c Caller, states []State, call *Call, room *room) ([]Decision, func()) {
	dryRun := reqs[0].DryRun
	if d, blocked := blocked(now, reqs); blocked {
		stateOf(d, states)
		for i := range states {
			if dryRun && states[i] == Banned {
				states[i] = WouldRefuse
			}
		}
		return d, nil
	}
	if !dryRun {
		if d, banned := l.banned(ctx, now, reqs, c.Events); banned {
			stateOf(d, states)
			return d, nil
		}
	}
	d, release := l.take(ctx, now, reqs, c, call, room)
	switch {
	case call.Failure != NoFailure && c.Fallback.Mode == FallbackAllow:
		fill(states, Unlimited)
	case call.Failure != NoFailure && c.Fallback.Mode == FallbackDeny:
		fill(states, Denied)
	default:
		stateOf(d, states)
	}
	if dryRun {
		for i, s := range states {
			switch s {
			case Refused, Banned:
				states[i] = WouldRefuse
			case Denied:
				states[i] = Unlimited
			}
		}
		return d, release
	}
	l.countRefusals(ctx, now, reqs, d, states, c.Events)
	return d, release
}

// anySync reports whether a request of reqs syncs.
func anySync(reqs []Request) bool {
	for _, r := range reqs {
		if r.Sync > 0 {
			return true
		}
	}
	return false
}

// takeSynced decides reqs, some of zones that sync: those from this
// instance's allowances first, then, if they all pass, the others in
// Redis; a refusal there gives the allowances back (all or nothing). The
// allowances' take is room's, when room is not nil: all of reqs syncing
// and none left to Redis, their decisions are in it.
func (l *Limiter) takeSynced(ctx context.Context, now time.Time, reqs []Request, c Caller, call *Call, room *room) ([]Decision, func()) {
	if now.IsZero() {
		now = time.Now()
	}
	t := new(fleetsync.Taken)
	if room != nil {
		t = &room.taken
	}
	if allSync(reqs) { // the common case: no copies of the requests and their decisions
		start := time.Now()
		l.sync.Take(now, reqs, c.Fallback.Instances, t)
		call.Store, call.Took = "sync", time.Since(start)
		if !t.Allowed() || len(t.Exact) == 0 {
			return t.Decisions, nil
		}
		all := make([]int, len(reqs))
		for i := range all {
			all[i] = i
		}
		return l.takeRest(ctx, now, reqs, all, nil, t, c, call)
	}
	var synced, exact []int
	for i, r := range reqs {
		if r.Sync > 0 {
			synced = append(synced, i)
		} else {
			exact = append(exact, i)
		}
	}
	start := time.Now()
	l.sync.Take(now, bucket.Pick(reqs, synced), c.Fallback.Instances, t)
	call.Store, call.Took = "sync", time.Since(start)
	return l.takeRest(ctx, now, reqs, synced, exact, t, c, call)
}

// allSync reports whether every request of reqs syncs.
func allSync(reqs []Request) bool {
	for _, r := range reqs {
		if r.Sync == 0 {
			return false
		}
	}
	return true
}

// takeRest decides, after the allowances decided reqs at synced (t), the
// others in Redis: exact, and the synced ones t left to Redis; a refusal
// there undoes t (all or nothing).
func (l *Limiter) takeRest(ctx context.Context, now time.Time, reqs []Request, synced, exact []int, t *fleetsync.Taken,
	c Caller, call *Call) ([]Decision, func()) {
	d := make([]Decision, len(reqs))
	for j, i := range synced {
		d[i] = t.Decisions[j]
	}
	if !t.Allowed() {
		return d, nil
	}
	toRedis := t.Exact
	for _, j := range toRedis { // a bucket's first request here, or a cost over the share
		exact = append(exact, synced[j])
	}
	if len(exact) == 0 {
		return d, nil
	}
	ed, release := l.takeExact(ctx, now, bucket.Pick(reqs, exact), c, call, nil)
	refused := call.Failure != NoFailure && c.Fallback.Mode == FallbackDeny
	for j, i := range exact {
		if j < len(ed) {
			d[i] = ed[j]
			refused = refused || ed[j].Limit > 0 && !ed[j].Allowed
		}
	}
	if refused {
		t.Undo()
		for _, i := range synced {
			if !slices.Contains(exact, i) {
				d[i] = Decision{}
			}
		}
		l.seed(reqs, synced, toRedis, make([]Decision, len(reqs)), call, c) // nothing charged: read next time
		return d, release
	}
	l.seed(reqs, synced, toRedis, d, call, c)
	return d, release
}

// seed gives the zones that sync the answers of their requests decided in
// Redis (zero when the fallback decided them, or when not charged).
func (l *Limiter) seed(reqs []Request, synced, toRedis []int, d []Decision, call *Call, c Caller) {
	for _, j := range toRedis {
		i, dec := synced[j], Decision{}
		if call.Failure == NoFailure {
			dec = d[i]
		}
		l.sync.Seed(reqs[i], dec, time.Time{}, c.Fallback.Instances)
	}
}

// blocked refuses reqs at now when one of them is blocked (the longest
// block shows; the other zones are not asked): nothing is charged.
func blocked(now time.Time, reqs []Request) ([]Decision, bool) {
	best := -1
	for i, r := range reqs {
		if r.Block > 0 && (best < 0 || r.Block > reqs[best].Block) {
			best = i
		}
	}
	if best < 0 {
		return nil, false
	}
	if now.IsZero() {
		now = time.Now()
	}
	r := reqs[best]
	d := make([]Decision, len(reqs))
	d[best] = Decision{Limit: r.Policy.Limit(), Reset: now.Add(r.Block), RetryAfter: r.Block, Banned: true, At: now}
	return d, true
}

// stateOf sets the state of each decision of d: a zero one (Limit 0) was
// not asked.
func stateOf(d []Decision, states []State) {
	for i, x := range d {
		switch {
		case x.Limit == 0:
			states[i] = NotAsked
		case x.Banned:
			states[i] = Banned
		case x.Allowed:
			states[i] = Allowed
		default:
			states[i] = Refused
		}
	}
}

func fill(states []State, s State) {
	for i := range states {
		states[i] = s
	}
}

// take decides reqs with Redis when configured, else in memory. When
// Redis cannot decide, c's fallback decides. The memory store decides
// into room's decisions when it can, the allowances of the zones that
// sync into room's take.
func (l *Limiter) take(ctx context.Context, now time.Time, reqs []Request, c Caller, call *Call, room *room) ([]Decision, func()) {
	if l.sync != nil && anySync(reqs) {
		return l.takeSynced(ctx, now, reqs, c, call, room)
	}
	return l.takeExact(ctx, now, reqs, c, call, room)
}

// takeExact decides reqs with Redis, or in memory without Redis (into
// room's decisions, room not nil); when Redis cannot decide, c's fallback
// decides.
func (l *Limiter) takeExact(ctx context.Context, now time.Time, reqs []Request, c Caller, call *Call, room *room) ([]Decision, func()) {
	if l.redis == nil {
		start := time.Now()
		if now.IsZero() {
			now = start // one clock reading
		}
		var dst []Decision
		if room != nil {
			dst = room.decisions
		}
		d := l.memory.TakeInto(now, reqs, dst)
		call.Store, call.Took = "memory", time.Since(start)
		return d, l.holdSlots(l.memory, reqs, d, c.Events)
	}
	wall := now.IsZero()
	if wall {
		now = time.Now()
	}
	d, err := l.takeRedis(ctx, now, reqs, c.Events, call)
	switch {
	case err == nil:
		return d, l.holdSlots(l.redis, reqs, d, c.Events)
	case redisstore.Unavailable(err):
		call.Failure, call.Err = StoreUnavailable, err
		l.nodeFailed(err, c.Events)
	default:
		call.Failure, call.Err = ScriptFailed, err
		last := l.scriptErrorLogged.Load()
		loud := now.UnixNano()-last >= int64(ScriptErrorReportEvery) && l.scriptErrorLogged.CompareAndSwap(last, now.UnixNano())
		c.Events.ScriptFailed(err, loud)
	}
	if wall {
		now = time.Now() // after the call that failed, which may have waited its timeout
	}
	return l.fallBack(now, reqs, c)
}

// takeRedis asks Redis, within the timeout, unless the cache of refused
// clients answers, or a node's breaker is open (the store keeps one per
// node). A client that leaves does not cut the call short: every call that
// starts ends as a success or a failure of its node's breaker (a probe
// included), and a script is sent at most once.
func (l *Limiter) takeRedis(ctx context.Context, now time.Time, reqs []Request, ev Events, call *Call) ([]Decision, error) {
	if d, hit := l.cachedRefusal(reqs, now); hit {
		return d, nil
	}
	start := time.Now()
	decisions, err := l.redis.TakeWithin(start, l.timeout, reqs)
	call.Store, call.Took = "redis", time.Since(start)
	var refund *redisstore.RefundError
	if errors.As(err, &refund) { // the request is refused either way
		ev.Debug("refund of a refused request failed; its tokens stay taken", err)
		l.releaseLater(reqs, ev) // its concurrency slots, at least
		err = nil
	}
	if err != nil {
		if bucket.MayHaveRun(err) { // a script may have taken slots before the error
			l.releaseLater(reqs, ev)
		}
		return nil, err
	}
	for i, d := range decisions {
		l.refused.Put(reqs[i], d, now)
	}
	if l.nFailing.Load() > 0 {
		l.nodesAnswered(ctx, reqs, ev)
	}
	return decisions, nil
}

// nodeFailed reports, once until it answers again, that the node of err
// failed; a node already failing is reported at debug level.
func (l *Limiter) nodeFailed(err error, ev Events) {
	var ne *redisstore.NodeError
	node := ""
	if errors.As(err, &ne) {
		node = ne.Node
	}
	if _, was := l.failing.LoadOrStore(node, true); was {
		ev.Debug("redis store failed", err)
		return
	}
	l.nFailing.Add(1)
	ev.StoreFailing(err)
}

// nodesAnswered reports the recovery of the failing nodes that reqs went
// to, which answered (and of a failure of no known node).
func (l *Limiter) nodesAnswered(ctx context.Context, reqs []Request, ev Events) {
	nodes := append(l.redis.NodesOf(ctx, reqs), "")
	for _, node := range nodes {
		if _, was := l.failing.LoadAndDelete(node); was {
			l.nFailing.Add(-1)
			ev.StoreRecovered(node)
		}
	}
}

// cachedRefusal answers a request that a zone refused lately from the
// cache of refused clients, without Redis: the refusing zone's decision,
// and zero decisions (not asked) for the others.
func (l *Limiter) cachedRefusal(reqs []Request, now time.Time) ([]Decision, bool) {
	for i, r := range reqs {
		d, hit := l.refused.Get(r, now)
		if !hit {
			continue
		}
		decisions := make([]Decision, len(reqs))
		decisions[i] = d
		return decisions, true
	}
	return nil, false
}

// noEvents are the Events of a caller that gave none: nothing is told.
type noEvents struct{}

func (noEvents) StoreFailing(error)               {}
func (noEvents) StoreRecovered(string)            {}
func (noEvents) ScriptFailed(error, bool)         {}
func (noEvents) BanStarted(string, time.Duration) {}
func (noEvents) Debug(string, error)              {}
