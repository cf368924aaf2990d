package overrides

// Writing the overrides back when Redis lost them. Every change moves the
// version on, and no change moves it back: an instance that finds the
// version gone, or at a number below the one it holds, knows that Redis
// lost the overrides, or their last changes (a restart without
// persistence, a failover to a replica that lacked the last writes, a
// restore from an older backup, an eviction), and not that someone
// deleted them (a delete moves the version on too). It then writes back
// what it holds that has not expired, with a version beyond both, in one
// script (overrides_restore.lua) that writes only while the version is
// still the one read: of the instances that find the loss, one writes;
// the others find the version moved on and read what it wrote. A Redis
// whose version has the number held but another nonce holds a history of
// its own (a change made after a loss, before any instance noticed): the
// instances read it, as any change.

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

// restorer is a source that can lose the overrides, and have them written
// back.
type restorer interface {
	// restore writes the entries of s (name, JSON, expiry) when the
	// version is still read ("" for none), with a version beyond held;
	// false, with the version found, when it is not.
	restore(ctx context.Context, read string, held int64, s *Set) (token string, written int, ok bool, err error)
}

// lost reports whether the version token read says Redis lost the
// overrides of cur: it is gone, or its number is below cur's.
func lost(cur *Set, token string) bool {
	held := tokenVersion(cur.tokenOf())
	return held > 0 && tokenVersion(token) < held
}

// restore writes back held, the overrides in force (cur, or cur with a
// change made since), when Redis's version is still read; else it reads
// what another instance wrote. The caller holds readMu.
func (o *Overrides) restore(ctx context.Context, cur, held *Set, read string) error {
	r, ok := o.src.(restorer)
	now := o.now()
	held = held.prune(now)
	if !ok || held.size() == 0 {
		return o.readAll(ctx, cur, "restore", false)
	}
	ended := o.wholeRead()
	token, n, won, err := r.restore(ctx, read, cur.Version(), held)
	ended()
	if err != nil {
		return o.failed(fmt.Errorf("writing back the overrides Redis lost: %w", err))
	}
	o.recovered()
	if !won {
		return o.readAll(ctx, cur, "restore", false)
	}
	why := fmt.Sprintf("Redis holds no version of the overrides, where this instance held version %d: Redis restarted or was flushed empty, or the keys were evicted or deleted by hand", cur.Version())
	if read != "" {
		why = fmt.Sprintf("Redis went back from version %d to version %d of the overrides: a failover to a replica that lacked the last changes, or a restore of an older copy", cur.Version(), tokenVersion(read))
	}
	o.ev.OverridesRestored(n, why)
	o.install(cur, held.apply(nil, token), "restore")
	return nil
}

var overridesRestore = redis.NewScript(luascripts.OverridesRestore)

func (r *redisOverrides) restore(ctx context.Context, read string, held int64, s *Set) (string, int, bool, error) {
	args := []any{read, held, nonce(), r.announce(ctx), r.channel}
	add := func(zone string, digest *[16]byte, o Override) error {
		b, err := json.Marshal(o)
		if err != nil {
			return fmt.Errorf("encoding an override: %w", err)
		}
		args = append(args, overrideField(zone, digest), string(b), o.Expires)
		return nil
	}
	for z, o := range s.zones {
		if err := add(z, nil, o); err != nil {
			return "", 0, false, err
		}
	}
	for z, k := range s.keys {
		for d, o := range k.all() {
			if err := add(z, &d, o); err != nil {
				return "", 0, false, err
			}
		}
	}
	var err error
	s.tombstones(func(z string, d *[16]byte, o Override) bool {
		err = add(z, d, o)
		return err == nil
	})
	if err != nil {
		return "", 0, false, err
	}
	var v []any
	v, err = overridesRestore.Run(ctx, r.client, []string{r.hash, r.versionKey, r.expiry}, args...).Slice()
	if err != nil {
		return "", 0, false, err
	}
	if len(v) < 2 {
		return "", 0, false, fmt.Errorf("%w: overrides restore reply of %d items", errReply, len(v))
	}
	won, _ := v[0].(int64)
	token, _ := v[1].(string)
	written := int64(0)
	if len(v) > 2 {
		written, _ = v[2].(int64)
	}
	return token, int(written), won == 1, nil
}

// Interface guard.
var _ restorer = (*redisOverrides)(nil)
