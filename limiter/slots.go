package limiter

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// Concurrency slots (max_concurrent): a request that a concurrency zone
// allowed holds a slot until its response ends. In Redis a slot is a
// lease: renewed while the request runs, given back at its end, and given
// back later when Redis did not answer, until the lease would have expired
// by itself.

// holdSlots returns the release of the concurrency slots that store took
// for reqs, decided as decisions say; nil when reqs hold none, as when a
// zone refused (the store took nothing: a refusal has nothing to give
// back, nor leases to renew). In Redis, where a slot is a lease, the
// leases are renewed every third of their lifetime until the release, so
// that a request that outlives its lease (a websocket, a long download)
// keeps counting, as it does in memory.
func (l *Limiter) holdSlots(store Store, reqs []Request, decisions []Decision, ev Events) func() {
	for _, d := range decisions {
		if !d.Allowed {
			return nil
		}
	}
	held := concurrencyRequests(reqs)
	if len(held) == 0 {
		return nil
	}
	if store == Store(l.memory) {
		return func() { l.releaseSlots(store, held, ev) }
	}
	stopRenewing := l.renewLeases(held, ev)
	return func() {
		stopRenewing()
		l.releaseSlots(store, held, ev)
	}
}

// concurrencyRequests are the requests of reqs that hold a concurrency slot.
func concurrencyRequests(reqs []Request) []Request {
	var held []Request
	for _, r := range reqs {
		if r.Policy.Algorithm == Concurrency {
			held = append(held, r)
		}
	}
	return held
}

// releaseSlots gives back the concurrency slots held, always: with a
// short timeout, even while a breaker is open. A release that Redis did not
// take is tried again in the background until its leases expire.
func (l *Limiter) releaseSlots(store Store, held []Request, ev Events) {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	err := store.Release(ctx, held)
	cancel()
	if err == nil {
		return
	}
	if l.retries != nil && store != Store(l.memory) {
		l.retries.add(held)
		ev.Debug("concurrency slots not released yet; trying again", err)
		return
	}
	ev.Debug("concurrency slots not released; their leases will expire", err)
}

// releaseLater gives back, in the background, the concurrency slots that
// Redis may have taken for reqs in a call that failed.
func (l *Limiter) releaseLater(reqs []Request, ev Events) {
	if held := concurrencyRequests(reqs); len(held) > 0 {
		go l.releaseSlots(l.redis, held, ev)
	}
}

// renewLeases renews the leases of held in Redis every third of the
// shortest lease, until the returned stop is called. A renewal that fails
// is tried again at the next tick; a lease that is gone (expired, reset)
// is not made again.
func (l *Limiter) renewLeases(held []Request, ev Events) (stop func()) {
	every := held[0].Policy.Lease
	for _, r := range held[1:] {
		every = min(every, r.Policy.Lease)
	}
	every /= 3
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
			if err := l.redis.Renew(ctx, held); err != nil {
				ev.Debug("concurrency leases not renewed; trying again", err)
			}
			cancel()
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}

// maxReleaseRetries bounds the releases waiting to be tried again: as many
// in the queue, and as many in a round.
const maxReleaseRetries = 10000

// releaseChunk bounds the releases of one call in a round: a script run is
// all or nothing, and holds Redis while it runs, so that thousands of
// releases (after a blip with many requests in flight) go as many small
// calls, which the store pipelines, and one that fails holds back no more
// than its chunk.
const releaseChunk = 16

// releaseRetryEvery is how often a release that failed is tried again.
const releaseRetryEvery = 250 * time.Millisecond

// releaseRetries are the releases of concurrency slots that Redis did not
// take, tried again until Redis takes them or their leases expire. Slots
// stay taken meanwhile, so the client is limited a little longer, never
// less.
//
// One goroutine per Redis limiter tries them in rounds, releaseRetryEvery apart
// while any are left. A round tries every pending release at once, in
// small calls grouped by Redis node, so that the releases bound for a node
// that does not answer never hold back the others: a release waits at most
// one round (the timeout) and releaseRetryEvery after its node answers
// again.
type releaseRetries struct {
	store   *redisstore.Store
	timeout time.Duration
	now     func() time.Time
	pending chan pendingRelease // the releases that failed, not yet tried again
	done    chan struct{}
	once    sync.Once
}

// pendingRelease is the release of one request's slots in one zone.
type pendingRelease struct {
	req   Request
	until time.Time // when its lease expires by itself
}

func newReleaseRetries(store *redisstore.Store, timeout time.Duration) *releaseRetries {
	r := &releaseRetries{store: store, timeout: timeout, now: time.Now,
		pending: make(chan pendingRelease, maxReleaseRetries), done: make(chan struct{})}
	go r.loop()
	return r
}

// add queues the release of reqs, which just failed; when the queue is
// full, the leases are left to expire.
func (r *releaseRetries) add(reqs []Request) {
	now := r.now()
	for _, q := range reqs {
		select {
		case r.pending <- pendingRelease{req: q, until: now.Add(q.Policy.Lease)}:
		default:
		}
	}
}

// loop waits for releases to try again, and tries them in rounds until
// none is left.
func (r *releaseRetries) loop() {
	var left []pendingRelease
	for {
		select {
		case <-r.done:
			return
		case p := <-r.pending:
			left = append(left, p)
		}
		for len(left) > 0 {
			left = r.round(r.drain(left))
			if len(left) == 0 {
				break
			}
			select {
			case <-r.done:
				return
			case <-time.After(releaseRetryEvery):
			}
		}
	}
}

// drain appends to left the releases queued meanwhile, up to
// maxReleaseRetries in all (the others are left to their leases).
func (r *releaseRetries) drain(left []pendingRelease) []pendingRelease {
	for len(left) < maxReleaseRetries {
		select {
		case p := <-r.pending:
			left = append(left, p)
		default:
			return left
		}
	}
	return left
}

// round tries each release of ps once, grouped by node in calls of at
// most releaseChunk, all calls at once, and returns those still to try:
// the releases whose call failed and whose leases have not expired yet.
func (r *releaseRetries) round(ps []pendingRelease) []pendingRelease {
	now := r.now()
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	byNode := map[string][]pendingRelease{}
	for _, p := range ps {
		if now.Before(p.until) {
			node := r.store.Node(ctx, p.req)
			byNode[node] = append(byNode[node], p)
		}
	}
	cancel()
	var chunks [][]pendingRelease
	for _, ps := range byNode {
		for c := range slices.Chunk(ps, releaseChunk) {
			chunks = append(chunks, c)
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var left []pendingRelease
	for _, ps := range chunks {
		wg.Go(func() {
			reqs := make([]Request, len(ps))
			for i, p := range ps {
				reqs[i] = p.req
			}
			ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
			defer cancel()
			if r.store.Release(ctx, reqs) != nil {
				mu.Lock()
				left = append(left, ps...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return left
}

// stop ends the goroutine; queued releases are left to their leases.
func (r *releaseRetries) stop() { r.once.Do(func() { close(r.done) }) }
