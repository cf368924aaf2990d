package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// load sends the run's requests to the fleet and records each decision.
type load struct {
	c       config
	fleet   *fleet
	keys    []string // the client keys, by index
	prefix  string   // of the run's Redis keys
	zipf    *zipf
	start   time.Time // the time base of the records
	caller  limiter.Caller
	decided atomic.Int64 // decisions made
	fellBak atomic.Int64 // decisions the store did not make
	behind  atomic.Int64 // paced workers that fell a second behind
	stop    atomic.Bool
	dry     bool      // the workers ask no decision: see generatorCost
	lat     latencies // each decision's time, by worker
}

// newLoad is the load of c on f.
func newLoad(c config, f *fleet) *load {
	keys := make([]string, c.keys)
	for k := range keys {
		keys[k] = fmt.Sprint("client-", k)
	}
	return &load{c: c, fleet: f, keys: keys, zipf: newZipf(c.keys, c.zipf),
		caller: limiter.Caller{Fallback: limiter.Fallback{Mode: limiter.FallbackLocal, Instances: c.instances}, Events: f.ev}}
}

// run starts the workers; stop ends them and returns their records.
func (ld *load) run() (stop func() []uint64) {
	ld.start = time.Now()
	recs := make([][]uint64, ld.c.workers)
	ld.lat = make(latencies, ld.c.workers)
	var wg sync.WaitGroup
	for w := range ld.c.workers {
		wg.Go(func() { recs[w] = ld.worker(w) })
	}
	return func() []uint64 {
		ld.stop.Store(true)
		wg.Wait()
		n := 0
		for _, r := range recs {
			n += len(r)
		}
		all := make([]uint64, 0, n)
		for _, r := range recs {
			all = append(all, r...)
		}
		return all
	}
}

// worker sends requests until stopped, each of a key drawn from the
// Zipf distribution to an instance drawn at random, paced to its part
// of -qps when set; it returns its records.
func (ld *load) worker(w int) []uint64 {
	rng := rand.New(rand.NewPCG(ld.c.seed, uint64(w)))
	global, syncEvery := ld.c.mode == modeRegions, ld.c.syncInterval()
	var gap time.Duration
	next := time.Now()
	if ld.c.qps > 0 {
		gap = time.Duration(float64(ld.c.workers) / ld.c.qps * float64(time.Second))
		next = next.Add(time.Duration(rng.Int64N(int64(max(gap, 1))))) // workers out of phase
	}
	recs := make([]uint64, 0, 1024)
	reqs := make([]limiter.Request, 1)
	var v limiter.Verdict
	for !ld.stop.Load() {
		if gap > 0 {
			next = ld.pace(next, gap)
		}
		k := ld.zipf.draw(rng)
		l := ld.fleet.instances[rng.IntN(len(ld.fleet.instances))]
		if ld.dry {
			recs = ld.dryRecord(recs, k)
			continue
		}
		reqs[0] = limiter.Request{Zone: "fleetsim", Key: ld.keys[k], Policy: ld.c.policy, Cost: 1,
			Global: global, Sync: syncEvery}.WithDigest(nil)
		asked := time.Now()
		l.Decide(context.Background(), time.Time{}, reqs, ld.caller, &v)
		ld.lat.took(w, time.Since(asked))
		recs = append(recs, record(k, ld.decidedAt(&v).Sub(ld.start), !v.Refused()))
		if v.Calls[0].Failure != limiter.NoFailure {
			ld.fellBak.Add(1)
		}
		v.Release()
		ld.decided.Add(1)
	}
	return recs
}

// dryRecord is a worker's own work for a decision it does not ask, the
// generator's alone: recording it (in a buffer it reuses) and counting
// it.
func (ld *load) dryRecord(recs []uint64, k int) []uint64 {
	if len(recs) == cap(recs) {
		recs = recs[:0]
	}
	recs = append(recs, record(k, time.Since(ld.start), k&1 == 0))
	ld.decided.Add(1)
	return recs
}

// pace waits until next, and returns the time of the request after; a
// worker a second behind starts again from now.
func (ld *load) pace(next time.Time, gap time.Duration) time.Time {
	now := time.Now()
	switch {
	case next.After(now):
		time.Sleep(next.Sub(now))
	case now.Sub(next) > time.Second:
		ld.behind.Add(1)
		next = now
	}
	return next.Add(gap)
}

// decidedAt is when v's zone was decided: its Decision.At (Redis's clock
// for a decision of Redis), else now (a refusal of the cache of refused
// clients, the fallback's allow or deny).
func (ld *load) decidedAt(v *limiter.Verdict) time.Time {
	if len(v.Decisions) > 0 && !v.Decisions[0].At.IsZero() && !v.Decisions[0].Cached {
		return v.Decisions[0].At
	}
	return time.Now()
}

// A record is one decision: its key, its time from the run's start in
// µs, and whether it admitted, in one uint64 that sorts by key, then
// time: key << 33 | µs << 1 | admitted.
func record(key int, at time.Duration, admitted bool) uint64 {
	us := uint64(min(max(at.Microseconds(), 0), math.MaxUint32))
	r := uint64(key)<<33 | us<<1
	if admitted {
		r |= 1
	}
	return r
}

// unrecord is what record recorded.
func unrecord(r uint64) (key int, at time.Duration, admitted bool) {
	return int(r >> 33), time.Duration(r>>1&math.MaxUint32) * time.Microsecond, r&1 == 1
}

// generatorCost is the load generator's own CPU per decision: its
// workers run for d as they did (paced, when they were), drawing keys and
// instances, recording and counting, but asking no decision (the fleet
// closed, nothing else runs), and the process's CPU is divided by what
// they counted.
func (ld *load) generatorCost(d time.Duration) time.Duration {
	ld.dry = true
	ld.stop.Store(false)
	d0, before := ld.decided.Load(), processCPU()
	stop := ld.run()
	time.Sleep(d)
	_ = stop()
	return (processCPU() - before) / time.Duration(max(ld.decided.Load()-d0, 1))
}
