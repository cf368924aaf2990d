package overrides

// Writing back what Redis lacks. Every whole read merges both ways: the
// instance takes what Redis holds, and writes back, entry by entry, every
// entry it holds (override or tombstone, not expired) that Redis lacks or
// holds an earlier change of (overrides_restore.lua, which keeps the later
// change of each entry, so that any number of instances may write back at
// once). That covers a Redis that lost the overrides or their last
// changes (a restart without persistence, a failover to a replica that
// lacked the last writes, a restore from an older backup, an eviction),
// a change copied to a Redis that restarted empty (the rest is written
// back around it, the change kept), and a stale instance's write-back
// (an instance that holds a later change, a tombstone, writes it back
// over it). The version then moves on, beyond both the one found and the
// one held, and the others read the entries written.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

// merger is a source that takes back the entries it lacks.
type merger interface {
	// merge writes the entries of changes that it lacks or holds an
	// earlier change of, moving the version beyond held when it writes
	// one; it says how many it wrote, and the versions before and after.
	merge(ctx context.Context, held int64, changes []entryChange) (written int, prev, next string, err error)
}

// newerHeld lists the entries of cur in force at now (overrides and
// tombstones) that s lacks, or holds an earlier change of.
func newerHeld(cur, s *Set, now time.Time) []entryChange {
	var out []entryChange
	visit := func(zone string, digest *[16]byte, o Override) bool {
		if h, ok := s.held(zone, digest); o.Active(now) && (!ok || h.Stamp.Compare(o.Stamp) < 0) {
			out = append(out, entryChange{zone: zone, digest: digest, o: o})
		}
		return true
	}
	if cur == nil {
		return nil
	}
	for z, o := range cur.zones {
		visit(z, nil, o)
	}
	for z, k := range cur.keys {
		for d, o := range k.all() {
			visit(z, &d, o)
		}
	}
	cur.tombstones(visit)
	return out
}

// mergeBack writes back the entries of cur that s, just read, lacks or
// holds an earlier change of, and returns s with them: at the version
// they moved Redis to when nothing came between, else at s's (the next
// poll reads again). The caller holds readMu.
func (o *Overrides) mergeBack(ctx context.Context, cur, s *Set) (*Set, error) {
	m, ok := o.src.(merger)
	ours := newerHeld(cur, s, o.now())
	if !ok || len(ours) == 0 {
		return s, nil
	}
	n, prev, next, err := m.merge(ctx, cur.Version(), ours)
	if err != nil {
		return nil, fmt.Errorf("writing back the overrides Redis lacks: %w", err)
	}
	if n == 0 {
		return s, nil
	}
	why := fmt.Sprintf("Redis held no version of the overrides, where this instance held version %d: Redis restarted or was flushed empty, or the keys were evicted or deleted by hand", cur.Version())
	switch {
	case tokenVersion(s.tokenOf()) >= cur.Version() && s.tokenOf() != "":
		why = "Redis lacked changes this instance holds: a Redis restarted, a copy to it, or an instance that wrote back an older state"
	case s.tokenOf() != "":
		why = fmt.Sprintf("Redis went back from version %d to version %d of the overrides: a failover to a replica that lacked the last changes, or a restore of an older copy", cur.Version(), s.Version())
	}
	o.ev.OverridesRestored(n, why)
	token := s.tokenOf()
	if prev == token {
		token = next
	}
	return s.apply(ours, token), nil
}

var overridesRestore = redis.NewScript(luascripts.OverridesRestore)

func (r *redisOverrides) merge(ctx context.Context, held int64, changes []entryChange) (int, string, string, error) {
	args := make([]any, 0, 4+6*len(changes))
	args = append(args, held, nonce(), r.announce(ctx), r.channel)
	for _, c := range changes {
		b, err := json.Marshal(c.o)
		if err != nil {
			return 0, "", "", fmt.Errorf("encoding an override: %w", err)
		}
		args = append(args, overrideField(c.zone, c.digest), string(b), c.o.Expires, c.o.Stamp.MS, c.o.Stamp.N, c.o.Stamp.Origin)
	}
	v, err := overridesRestore.Run(ctx, r.client, []string{r.hash, r.versionKey, r.expiry}, args...).Slice()
	if err != nil {
		return 0, "", "", err
	}
	if len(v) != 3 {
		return 0, "", "", fmt.Errorf("%w: overrides restore reply of %d items", errReply, len(v))
	}
	n, _ := v[0].(int64)
	prev, _ := v[1].(string)
	next, _ := v[2].(string)
	return int(n), prev, next, nil
}

// Interface guard.
var _ merger = (*redisOverrides)(nil)
