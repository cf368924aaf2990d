package fleetsync

// The instances of a fleet that syncs, as each instance counts them (N in
// the package doc, doc.go).
//
// An instance registers in the fleet (Redis's sorted set
// <prefix>{sync}:instances, on Redis's clock; a storage fleet counts the
// files written) every registerEvery from its first request of a zone
// that syncs, whether rounds run that often or not, and counts those that
// registered within instancesWindow. Invariants, each held by a test:
//
//   - N never falls below on_store_error local's instances (the floor the
//     requests carry), in shares handed out at a request or at a round
//     (TestSyncFloorInRounds).
//   - A count lower than N is taken only once no registration has counted
//     N or more for instancesWindow: an instance that stopped is counted
//     as long as its registration lasts anyway, and a Redis that restarts
//     empty (every registration lost at once) does not make each instance
//     count itself alone while the others register again
//     (TestSyncCountAfterEmptyRedis).
//   - An instance hands out no share until it is warm: registered twice,
//     registerEvery apart, with no gap of instancesWindow since; until
//     then it decides in Redis, exactly (TestSyncFleetStartsTogether).
//   - When N grows, the allowances held shrink in proportion at once, not
//     at each bucket's next round (TestSyncShareShrinksAsFleetGrows).
//   - A registration that fails is a failed round (Events.Synced), so
//     that an instance that cannot register, and so decides everything in
//     Redis, says so (TestSyncRegistrationFailureReported).

import (
	"context"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// registerEvery is how often an instance registers (with rounds or not),
// and InstancesWindow how long a registration counts.
const (
	registerEvery   = time.Second
	InstancesWindow = 10 * time.Second
)

// register marks this instance as syncing and counts the instances (see
// the invariants above): at most every registerEvery, unless force. It
// returns the registration's error; nil when it made none.
func (s *Syncer) register(ctx context.Context, now time.Time, force bool) error {
	s.regMu.Lock()
	if !force && now.Sub(s.lastSeen) < registerEvery {
		s.regMu.Unlock()
		return nil
	}
	s.lastSeen = now
	s.regMu.Unlock()
	start := time.Now()
	n, err := s.fleet.RegisterSync(ctx, s.id, InstancesWindow)
	if err != nil {
		if ev := s.ev.Load(); ev != nil {
			(*ev).Synced(0, time.Since(start), err)
		}
		return err
	}
	s.counted(now, max(n, 1))
	return nil
}

// counted takes n, the instances a registration at now counted.
func (s *Syncer) counted(now time.Time, n int64) {
	s.regMu.Lock()
	if s.lastOK.IsZero() || now.Sub(s.lastOK) > InstancesWindow { // the first, or after a gap: warm again
		s.firstReg = now
		s.warm.Store(false)
	}
	warm := now.Sub(s.firstReg) >= registerEvery
	s.lastOK = now
	cur := s.n.Load()
	if n >= cur || s.highAt.IsZero() {
		s.highAt = now
	} else if now.Sub(s.highAt) < InstancesWindow {
		n = cur // fewer: taken once it lasts instancesWindow
	}
	s.regMu.Unlock()
	old := s.n.Swap(n)
	if n > old {
		s.shrink(old, n)
	}
	if warm {
		s.warm.Store(true) // after N: no share of the first count
	}
	if old != n {
		if ev := s.ev.Load(); ev != nil {
			(*ev).InstancesChanged(int(n))
		}
	}
}

// shrink cuts every allowance held from a share of old instances to a
// share of n.
func (s *Syncer) shrink(old, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.entries {
		e.allowance = e.allowance * old / n
		e.granted = min(e.granted, e.allowance)
	}
}

// OnEvents sets who is told of the rounds.
func (s *Syncer) OnEvents(ev Events) { s.ev.Store(&ev) }

// Instances is the number of instances syncing, this one included, as
// last counted.
func (s *Syncer) Instances() int { return int(s.n.Load()) }

// Ready reports whether the instance hands out shares (it is warm).
func (s *Syncer) Ready() bool { return s.warm.Load() }

// Count counts the instances syncing, this one included, as a config
// with zones that sync of interval every loads. It registers nothing:
// the instance registers from its first request of such a zone.
func (s *Syncer) Count(ctx context.Context, every time.Duration) int {
	s.atMost(every)
	n, err := s.fleet.CountSync(ctx, s.id, InstancesWindow)
	if err == nil && !s.warm.Load() {
		s.n.Store(max(n, 1))
	}
	return int(max(n, s.n.Load(), 1))
}

// Entries is how many buckets the Syncer holds a view of.
func (s *Syncer) Entries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Share is what this instance holds of r's bucket: its allowance until
// the next round, and the allowance as the last round granted it; ok is
// false when it holds no view of the bucket.
func (s *Syncer) Share(r bucket.Request) (allowance, granted int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[bucket.IDOf(r)]
	if e == nil {
		return 0, 0, false
	}
	return e.allowance, e.granted, true
}
