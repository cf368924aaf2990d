package fleetsync_test

import (
	"context"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
)

// instance is one instance of a storage fleet as package limiter makes it
// (limiter.New with a Storage): a StorageFleet, the Syncer of the zones
// that sync through it, and the memory of the local share.
type instance struct {
	fleet  *fleetsync.StorageFleet
	sync   *fleetsync.Syncer
	memory *memstore.Store
}

// newInstance starts an instance writing to and reading st.
func newInstance(st fleetsync.Storage, o fleetsync.StorageOptions) *instance {
	f := fleetsync.NewStorageFleet(st, o)
	m := memstore.New(0)
	in := &instance{fleet: f, sync: fleetsync.NewSyncer(f, m, time.Second), memory: m}
	f.Start()
	return in
}

// Decide decides reqs, of zones that sync, as the limiter does: from the
// Syncer's allowances, all or nothing (a storage fleet leaves none to an
// exact store).
func (in *instance) Decide(_ context.Context, now time.Time, reqs []limiter.Request, c limiter.Caller, v *limiter.Verdict) {
	if now.IsZero() {
		now = time.Now()
	}
	var t fleetsync.Taken
	in.sync.Take(now, reqs, c.Fallback.Instances, &t)
	d := t.Decisions
	v.Requests, v.Decisions, v.States = reqs, d, v.States[:0]
	for i := range d {
		state := limiter.Refused
		if t.Allowed() && d[i].Allowed {
			state = limiter.Allowed
		}
		v.States = append(v.States, state)
	}
}

// Peek is req's bucket as this instance last read the fleet's counts.
func (in *instance) Peek(ctx context.Context, req bucket.Request) (bucket.Decision, error) {
	req.Cost, req.ID = 0, ""
	d, err := in.fleet.ChargeAll(ctx, []bucket.Request{req})
	if err != nil {
		return bucket.Decision{}, err
	}
	return d[0], nil
}

// CountSync counts the instances of the fleet (Syncer.Count).
func (in *instance) CountSync(ctx context.Context, every time.Duration) int {
	return in.sync.Count(ctx, every)
}

// Instances is the number of instances counted.
func (in *instance) Instances() int { return in.sync.Instances() }

// Close stops the instance as the limiter does: the Syncer's last round,
// then the fleet's last write.
func (in *instance) Close() error {
	in.sync.Close()
	in.fleet.Close()
	return in.memory.Close()
}
