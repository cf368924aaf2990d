package ratelimit

// Run-time overrides of the zones' limits (overrides.Overrides keeps them
// current): what they do applied to a request (overrides.Set.Effect says
// what), where each store keeps them, and what is logged and counted when
// they change. The admin API that changes them is in admin_overrides.go.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// overridesStartTimeout bounds the first read of the overrides when a
// config loads: past it, the config serves with the overrides it has
// (none at first start) and reads them in the background.
const overridesStartTimeout = 3 * time.Second

// override applies to req, z's request, what the overrides in force of
// set do to it (overrides.Set.Effect: the zone's, then its key's). False
// when the key is exempt: z does not count the request. The key's digest
// is looked up only when some key of z has an override.
func (z *Zone) override(set *overrides.Set, req *limiter.Request, c *overrides.Clock, logger *zap.Logger) bool {
	var key *[16]byte
	if set.HasKeys(z.name) {
		d := req.Digest()
		key = &d
	}
	e := set.Effect(z.effectTarget(req.Policy), key, c)
	z.apply(&e, req, logger)
	return !e.Exempt
}

// apply gives req, z's request, what e says the overrides do to it,
// logging once per zone an override's limits left out; an exempt key's
// request keeps its policy.
func (z *Zone) apply(e *overrides.Effect, req *limiter.Request, logger *zap.Logger) {
	if e.LeftOut != nil {
		z.warnOverride(logger, e.LeftOut)
	}
	if e.DryRun != nil {
		req.DryRun = *e.DryRun
	}
	if !e.Exempt {
		req.Policy, req.Block = e.Policy, e.Block
	}
}

// effectTarget is z as its overrides see it, for a request whose
// policy under the config is p.
func (z *Zone) effectTarget(p limiter.Policy) overrides.Target {
	return overrides.Target{Zone: z.name, Policy: p, BurstSet: z.Burst != "", Check: z.takesOverridden}
}

// takesOverridden reports whether z takes p, a policy under an override,
// besides p's own validity: the algorithm's bounds that the config's
// policy passes, and the sync's.
func (z *Zone) takesOverridden(p limiter.Policy) error {
	return cmp.Or(checkAlgorithmLimits(p), z.syncFits(p))
}

// warnOverride logs, once per zone, that an override was left out.
func (z *Zone) warnOverride(logger *zap.Logger, err error) {
	if z.warned[fieldOverride].CompareAndSwap(false, true) {
		logger.Warn("a run-time override does not fit this zone and is left out: the config's limit applies to what it would change; "+
			"see GET /rate_limit/overrides, and set it again or delete it (logged once per zone)",
			zap.String("zone", z.name), zap.Error(err))
	}
}

// logSyncBounds logs, for each zone of h that syncs, how far beyond its
// exact limit the fleet may admit, from the instances syncing now (at
// least on_store_error local's instances), and has the store log it
// again whenever the instances counted change (InstancesChanged).
func (h *Handler) logSyncBounds() {
	for _, z := range h.zones {
		if z.Sync == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n := h.store.CountSync(ctx, time.Duration(z.Sync))
		cancel()
		h.store.holdSyncing(h, true)
		h.logBounds(n)
		return
	}
}

// logBounds logs the bound of each zone of h that syncs with n instances
// counted.
func (h *Handler) logBounds(n int) {
	n = max(n, h.caller.Fallback.Instances, 1)
	for _, z := range h.zones {
		if z.Sync == 0 {
			continue
		}
		b := syncBound(z.policy, time.Duration(z.Sync), n)
		h.logger.Info("zone syncs "+h.syncedThrough()+": its decisions are local, and over any period the fleet may admit beyond the exact limit up to rate × sync + (instances − 1) / instances × (burst + rate × sync)",
			zap.String("zone", z.name), zap.String("algorithm", z.policy.Algorithm.String()), zap.Duration("sync", time.Duration(z.Sync)), zap.Int("instances", n),
			zap.Int64("bound", b), zap.String("with_one_more_instance", fmt.Sprint(syncBound(z.policy, time.Duration(z.Sync), n+1))))
	}
}

// InstancesChanged logs the bounds of the zones that sync again, for the
// n instances counted now (fleetsync.Events).
func (s *sharedStore) InstancesChanged(n int) {
	s.capacityMu.Lock()
	hs := slices.Collect(maps.Keys(s.syncing))
	s.capacityMu.Unlock()
	for _, h := range hs {
		h.logBounds(n)
	}
}

// holdSyncing records whether h, which has zones that sync, holds the
// store (false: h lets go of it).
func (s *sharedStore) holdSyncing(h *Handler, holds bool) {
	s.capacityMu.Lock()
	defer s.capacityMu.Unlock()
	if !holds {
		delete(s.syncing, h)
		return
	}
	if s.syncing == nil {
		s.syncing = map[*Handler]bool{}
	}
	s.syncing[h] = true
}

// syncedThrough says where the zones that sync share their counts.
func (h *Handler) syncedThrough() string {
	if h.storage != nil {
		return "through the storage"
	}
	return "with Redis"
}

// syncBound is the most a fleet of n instances syncing every interval may
// admit beyond policy's exact limit over a period (see
// limiter/fleetsync/doc.go), rounded up.
func syncBound(p limiter.Policy, interval time.Duration, n int) int64 {
	n = max(n, 1)
	refill := float64(p.Rate) * interval.Seconds() / p.Period.Seconds()
	over := refill + (float64(p.Burst)+refill)*float64(n-1)/float64(n)
	return int64(math.Ceil(over))
}

// Synced counts a round of the zones that sync, and logs when rounds
// start failing and when they work again (fleetsync.Events).
func (s *sharedStore) Synced(keys int, took time.Duration, err error) {
	countSync(keys, took, err)
	if err != nil {
		if !s.syncFailing.Swap(true) {
			s.logger.Warn("rounds of the zones that sync fail: "+s.syncFailure(err)+"; each instance admits its share of their limits (as on_store_error local), and what it admits is counted when rounds succeed again",
				zap.String("store", s.label()), zap.Error(err))
		}
		return
	}
	if s.syncFailing.Swap(false) {
		s.logger.Info("zones that sync reach "+s.fleetName()+" again", zap.String("store", s.label()))
	}
}

// syncFailure says what made a round fail: a reply of Redis's that is an
// error (the store answered: the error's code), a time-out, or no answer.
func (s *sharedStore) syncFailure(err error) string {
	code, replied := limiter.ReplyCode(err)
	switch {
	case errors.Is(err, limiter.ErrBreakerOpen):
		return "the circuit breaker skips " + s.fleetName() + " after its failures"
	case replied:
		return s.fleetName() + " answered with the error " + code
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return s.fleetName() + " did not answer within the timeout"
	}
	return "cannot reach " + s.fleetName()
}

// isTimeout reports whether err is a network time-out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// fleetName names where the zones that sync share their counts.
func (s *sharedStore) fleetName() string {
	if s.Kind() == limiter.StoreStorage {
		return "the storage"
	}
	return "Redis"
}

// countSync counts a round of the zones that sync (or a read of the
// others' counts in a storage): its keys, its latency, its result.
func countSync(keys int, took time.Duration, err error) {
	metrics.syncDuration.Observe(took.Seconds())
	metrics.syncedKeys.Add(float64(keys))
	result := "ok"
	if err != nil {
		result = "error"
	}
	metrics.syncs.WithLabelValues(result).Inc()
}

// provisionOverrides has the store read its overrides before h serves,
// and h's overrides_poll join those of the store's other handlers.
func (h *Handler) provisionOverrides() {
	h.store.holdPoll(h, time.Duration(h.OverridesPoll))
	ctx, cancel := context.WithTimeout(context.Background(), overridesStartTimeout)
	defer cancel()
	if err := h.store.overrides.Start(ctx); err != nil {
		h.logger.Warn("rate limit overrides not read as the config loads: those last read apply (none at first start) until they are",
			zap.String("store", string(h.store.Kind())), zap.Error(err))
	}
}

// holdPoll records the overrides_poll of h (0: none set; -1: h lets go of
// the store) and sets the store's poll to the shortest that the handlers
// holding it set, or else the default.
func (s *sharedStore) holdPoll(h *Handler, d time.Duration) {
	s.capacityMu.Lock()
	defer s.capacityMu.Unlock()
	switch {
	case d > 0:
		if s.polls == nil {
			s.polls = make(map[*Handler]time.Duration)
		}
		s.polls[h] = d
	default:
		delete(s.polls, h)
	}
	poll := time.Duration(0)
	for _, p := range s.polls {
		if poll == 0 || p < poll {
			poll = p
		}
	}
	poll = cmp.Or(poll, overrides.DefaultPoll)
	if poll != s.poll {
		s.poll = poll
		s.overrides.SetPoll(poll)
	}
}

// overrideEvents logs and counts what happens to a store's overrides
// (overrides.Events).
type overrideEvents struct{ s *sharedStore }

// OverridesLoaded counts the overrides now in force, and logs those that
// expired (a zone's on a line of its own, the keys' counted per zone); the
// loads themselves are logged at debug level.
func (e overrideEvents) OverridesLoaded(set *overrides.Set, via string, expired []overrides.Entry) {
	zones, keys := set.Count(time.Now())
	label := e.s.label()
	metrics.overrides.WithLabelValues(label, "zone").Set(float64(zones))
	metrics.overrides.WithLabelValues(label, "key").Set(float64(keys))
	e.s.logger.Debug("rate limit overrides read", zap.String("store", label), zap.String("via", via),
		zap.Int64("version", set.Version()), zap.Int("zones", zones), zap.Int("keys", keys))
	keyed := map[string]int{}
	for _, x := range expired {
		if x.Digest != "" {
			keyed[x.Zone]++
			continue
		}
		e.s.logger.Info("rate limit override expired: the config's limit applies again",
			zap.String("zone", x.Zone), zap.String("kind", x.Kind()), zap.Time("expired", x.ExpiresAt()))
	}
	for _, zone := range slices.Sorted(maps.Keys(keyed)) {
		e.s.logger.Info("rate limit overrides of keys expired: the config's limit applies to them again",
			zap.String("zone", zone), zap.Int("keys", keyed[zone]))
	}
}

// OverridesNotPushed logs that changes arrive through the poll alone.
func (e overrideEvents) OverridesNotPushed(err error) {
	e.s.logger.Warn("rate limit overrides: Redis does not confirm the subscription to their changes, which other instances "+
		"then reach here only at each overrides_poll; if Redis has ACLs, allow the channel (see the Redis docs)",
		zap.String("store", e.s.label()), zap.Error(err))
}

// OverrideSkipped logs an entry that could not be read, a key's named by
// its zone alone (its digest may not be keyed).
func (e overrideEvents) OverrideSkipped(entry string, err error) {
	if rest, ok := strings.CutPrefix(strings.Trim(entry, `"`), "key:"); ok {
		_, zone, _ := strings.Cut(rest, ":")
		entry = fmt.Sprintf("a key's override in zone %.80q", zone)
	}
	e.s.logger.Warn("rate limit override skipped: its entry in the store is not one this version reads",
		zap.String("store", e.s.label()), zap.String("entry", entry), zap.Error(err))
}

// OverridesRestored logs and counts a write-back of the overrides to a
// Redis that lost them.
func (e overrideEvents) OverridesRestored(n int, why string) {
	metrics.overridesRestored.WithLabelValues(e.s.label()).Inc()
	e.s.logger.Warn("rate limit overrides restored: Redis had lost them, and this instance wrote back those it held that had not expired; "+
		"the other instances read them from Redis",
		zap.String("store", e.s.label()), zap.Int("restored", n), zap.String("why", why))
}

// OverridesOverLimit logs that the store holds more overrides than an
// instance reads.
func (e overrideEvents) OverridesOverLimit(held, read int) {
	e.s.logger.Warn("rate limit overrides: the store holds more entries than an instance reads; the rest are left out "+
		"(logged once, until they fit): delete overrides through the admin API, or look for entries written into Redis by hand",
		zap.String("store", e.s.label()), zap.Int("entries", held), zap.Int("read", read))
}

// OverridesFailing logs that the overrides cannot be read, and when they
// can again.
func (e overrideEvents) OverridesFailing(err error) {
	if err != nil {
		e.s.logger.Warn("rate limit overrides cannot be read: the last ones read stay in force until they can",
			zap.String("store", e.s.label()), zap.Error(err))
		return
	}
	e.s.logger.Info("rate limit overrides read again", zap.String("store", e.s.label()))
}

// label names the store in the overrides' admin API, metric and logs:
// "memory", or the Redis's addresses, then its db and key prefix when
// they are not the defaults ("10.0.1.2:6379 db 1 prefix api:").
func (s *sharedStore) label() string {
	if s.Kind() == limiter.StoreMemory {
		return string(limiter.StoreMemory)
	}
	return s.namespace
}

// Interface guard.
var _ overrides.Events = overrideEvents{}

// syncFits reports whether p fits the sync of every zone of t's name.
func (t overrideTarget) syncFits(p limiter.Policy) error {
	for _, ref := range t.refs {
		if err := ref.z.syncFits(p); err != nil {
			return err
		}
	}
	return nil
}

// syncBound is, for a zone that syncs, the bound of the fleet's
// overshoot (see syncBound) under o, for the instances counted now; false
// for a zone that does not sync, or an override that sets no limit.
func (t overrideTarget) syncBound(o *overrides.Override) (int64, bool) {
	if len(t.refs) == 0 || t.refs[0].z.Sync == 0 || o.Fits(t.refs[0].z.policy.Algorithm) != nil || o.Kind() != "limit" {
		return 0, false
	}
	z, h := t.refs[0].z, t.refs[0].h
	n := max(t.store.Instances(), h.caller.Fallback.Instances, 1)
	return syncBound(o.Apply(z.policy, z.Burst != ""), time.Duration(z.Sync), n), true
}
