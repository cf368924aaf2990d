package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// fleet is the run's instances, each made by a limiter.New of its own:
// its own Redis clients, syncer and exchange, as a Caddy of its own.
type fleet struct {
	instances []*limiter.Limiter
	ev        *events
}

// events counts what the instances tell: failures, rounds, exchanges.
// It is the run's observer, shared by every instance; the instances
// share nothing through it.
type events struct {
	failures, scripts    atomic.Int64 // StoreFailing, ScriptFailed
	roundsOK, roundsFail atomic.Int64 // the syncers' rounds
	synced               atomic.Int64 // buckets the rounds charged
	exchOK, exchFail     atomic.Int64 // the regions' exchanges
	linksDown, dropped   atomic.Int64
	lastErr              atomic.Value // the last error told, a string
}

func (e *events) failed(err error) {
	if err != nil {
		e.lastErr.Store(err.Error())
	}
}

func (e *events) StoreFailing(err error)           { e.failures.Add(1); e.failed(err) }
func (e *events) StoreRecovered(string)            {}
func (e *events) ScriptFailed(err error, _ bool)   { e.scripts.Add(1); e.failed(err) }
func (e *events) BanStarted(string, time.Duration) {}
func (e *events) Debug(string, error)              {}
func (e *events) InstancesChanged(int)             {}
func (e *events) Heard(string, bool)               {}
func (e *events) Flooding(bool)                    {}
func (e *events) ConfigDiffers(string, string)     {}
func (e *events) Dropped(_ string, n int)          { e.dropped.Add(int64(n)) }
func (e *events) Synced(keys int, _ time.Duration, err error) {
	if err != nil {
		e.roundsFail.Add(1)
		e.failed(err)
		return
	}
	e.roundsOK.Add(1)
	e.synced.Add(int64(keys))
}

func (e *events) Exchanged(_ string, _ int, _ time.Duration, err error) {
	if err != nil {
		e.exchFail.Add(1)
		e.failed(err)
		return
	}
	e.exchOK.Add(1)
}

func (e *events) LinkChanged(_ string, up bool, err error) {
	if !up {
		e.linksDown.Add(1)
		e.failed(err)
	}
}

// newFleet makes c's instances, instance i in region i mod R, each with
// the peers of its region when the mode is regions.
func newFleet(c config, prefix string, ev *events) (*fleet, error) {
	f := &fleet{ev: ev}
	for i := range c.instances {
		home := c.regions[i%len(c.regions)]
		o := home.options(c, prefix)
		lc := limiter.Config{Redis: &o, LocalCache: c.localCache, LocalCacheMaxAge: 5 * time.Second, Sync: ev}
		if c.mode == modeRegions {
			peers := map[string]limiter.RedisOptions{}
			for _, r := range c.regions {
				if r.name != home.name {
					peers[r.name] = r.options(c, prefix)
				}
			}
			lc.Regions = &limiter.Regions{This: home.name, Peers: peers, Interval: c.exchange}
			lc.RegionEvents = ev
		}
		l, err := limiter.New(lc)
		if err != nil {
			_ = f.close()
			return nil, fmt.Errorf("instance %d (region %s): %w", i, home.name, err)
		}
		f.instances = append(f.instances, l)
	}
	return f, nil
}

// warm waits until every instance answers and decides as it will in the
// run: in sync, registered and counting the whole fleet; in regions,
// counting every region.
func (f *fleet) warm(ctx context.Context, c config) error {
	for i, l := range f.instances {
		if err := l.Ping(ctx); err != nil {
			return fmt.Errorf("instance %d: redis: %w", i, err)
		}
	}
	switch c.mode {
	case modeSync:
		return f.warmSync(ctx, c)
	case modeRegions:
		limit := 10*(c.exchange+c.timeout) + 10*time.Second
		return f.await(limit, "every instance counting every region", func(l *limiter.Limiter) bool {
			_, counted := l.RegionLinks()
			return counted == len(c.regions)
		})
	}
	return nil
}

// warmSync starts the syncers' rounds, as a first request of a zone that
// syncs does (one costing nothing), and waits until every instance is warm
// and counts the others.
func (f *fleet) warmSync(ctx context.Context, c config) error {
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Second, Burst: 1}
	start := limiter.Request{Zone: "fleetsim-start", Key: "start", Policy: p, Sync: c.sync}.WithDigest(nil)
	var wg sync.WaitGroup
	for _, l := range f.instances {
		wg.Go(func() {
			l.CountSync(ctx, c.sync)
			var v limiter.Verdict
			l.Decide(ctx, time.Time{}, []limiter.Request{start}, limiter.Caller{Events: f.ev}, &v)
			v.Release()
		})
	}
	wg.Wait()
	n := len(f.instances)
	return f.await(30*time.Second, fmt.Sprintf("every instance warm and counting %d", n), func(l *limiter.Limiter) bool {
		return l.SyncReady() && l.Instances() == n
	})
}

// await polls every instance until ready holds for all, for at most limit.
func (f *fleet) await(limit time.Duration, what string, ready func(*limiter.Limiter) bool) error {
	for deadline := time.Now().Add(limit); ; time.Sleep(20 * time.Millisecond) {
		all := true
		for _, l := range f.instances {
			all = all && ready(l)
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not %s after %s", what, limit)
		}
	}
}

// close closes every instance, at once: each makes its last round and
// exchange.
func (f *fleet) close() error {
	errs := make([]error, len(f.instances))
	var wg sync.WaitGroup
	for i, l := range f.instances {
		wg.Go(func() { errs[i] = l.Close() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// bound is how far beyond the exact limit the mode may admit per key over
// the run, as stated: see the package doc.
func (f *fleet) bound(c config) float64 {
	switch c.mode {
	case modeSync:
		return float64(syncBound(c.policy, c.sync, len(f.instances)))
	case modeRegions:
		return f.instances[0].RegionBound(c.policy)
	}
	return 0
}

// syncBound is the most a fleet of n instances syncing every interval may
// admit beyond p's exact limit over a period, rounded up: rate × interval
// + (n − 1)/n × (burst + rate × interval), as limiter/fleetsync's doc
// states it (the Caddy module logs it: zonesync.go's syncBound).
func syncBound(p limiter.Policy, interval time.Duration, n int) int64 {
	n = max(n, 1)
	refill := float64(p.Rate) * interval.Seconds() / p.Period.Seconds()
	return int64(math.Ceil(refill + (float64(p.Burst)+refill)*float64(n-1)/float64(n)))
}
