package limiter

// The instances of a fleet that syncs, as each instance counts them (N in
// the doc of sync.go).
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
//   - A registration that fails is a failed round (SyncEvents.Synced), so
//     that an instance that cannot register, and so decides everything in
//     Redis, says so (TestSyncRegistrationFailureReported).

import (
	"context"
	"time"
)

// registerEvery is how often an instance registers (with rounds or not),
// and instancesWindow how long a registration counts.
const (
	registerEvery   = time.Second
	instancesWindow = 10 * time.Second
)

// Instances is the number of instances syncing with this one's Redis,
// this one included, as last counted.
func (l *Limiter) Instances() int {
	if l.sync == nil {
		return 1
	}
	return int(l.sync.n.Load())
}

// SyncReady reports whether the instance hands out shares of the zones
// that sync (it is warm: see above); false without such zones.
func (l *Limiter) SyncReady() bool { return l.sync != nil && l.sync.warm.Load() }

// CountSync counts the instances syncing with this one's Redis (or
// storage), this one included, as a config with zones that sync of
// interval every loads. It registers nothing: the instance registers from
// its first request of such a zone.
func (l *Limiter) CountSync(ctx context.Context, every time.Duration) int {
	if l.sync == nil {
		return 1
	}
	l.sync.atMost(every)
	n, err := l.sync.fleet.CountSync(ctx, l.sync.id, instancesWindow)
	if err == nil && !l.sync.warm.Load() {
		l.sync.n.Store(max(n, 1))
	}
	return int(max(n, l.sync.n.Load(), 1))
}

// register marks this instance as syncing and counts the instances (see
// the invariants above): at most every registerEvery, unless force. It
// returns the registration's error; nil when it made none.
func (s *syncer) register(ctx context.Context, now time.Time, force bool) error {
	s.regMu.Lock()
	if !force && now.Sub(s.lastSeen) < registerEvery {
		s.regMu.Unlock()
		return nil
	}
	s.lastSeen = now
	s.regMu.Unlock()
	start := time.Now()
	n, err := s.fleet.RegisterSync(ctx, s.id, instancesWindow)
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
func (s *syncer) counted(now time.Time, n int64) {
	s.regMu.Lock()
	if s.lastOK.IsZero() || now.Sub(s.lastOK) > instancesWindow { // the first, or after a gap: warm again
		s.firstReg = now
		s.warm.Store(false)
	}
	warm := now.Sub(s.firstReg) >= registerEvery
	s.lastOK = now
	cur := s.n.Load()
	if n >= cur || s.highAt.IsZero() {
		s.highAt = now
	} else if now.Sub(s.highAt) < instancesWindow {
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
func (s *syncer) shrink(old, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.entries {
		e.allowance = e.allowance * old / n
		e.granted = min(e.granted, e.allowance)
	}
}
