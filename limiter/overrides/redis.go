package overrides

// The overrides kept in Redis (see overrides.go): the keys, a change's
// write, and the subscription to the changes announced. Reading them, with
// the bounds on what Redis can hand an instance, is in read.go; writing
// them back when Redis lost them, in restore.go.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

// NewRedis returns the overrides kept in the Redis of client, under prefix
// (the store's key prefix), in database db: see the top of this file.
func NewRedis(client redis.UniversalClient, prefix string, db int, ev Events) *Overrides {
	base := prefix + "{overrides}"
	r := &redisOverrides{client: client, hash: base, versionKey: base + ":version", expiry: base + ":expiry",
		channel: base + ":changed"}
	if db != 0 { // channels are not a database's: one of its own
		r.channel += fmt.Sprintf(":db%d", db)
	}
	_, r.cluster = client.(*redis.ClusterClient)
	r.ev = ev
	return newOverrides(r, ev)
}

// redisOverrides keeps the overrides in Redis.
type redisOverrides struct {
	client                            redis.UniversalClient
	hash, versionKey, expiry, channel string
	cluster                           bool
	sharded                           atomic.Int32 // 0: not known yet; 1: yes; 2: no
	quiet                             bool         // tests: changes are not announced
	unannounced                       atomic.Bool  // a change could not be announced (reported once)
	ev                                Events
	subscribeTimeout                  time.Duration // default 10s
	scanCount                         int64         // HSCAN's COUNT; default 1000
	afterScan                         func()        // tests: called after each whole read's scan
}

var overridesWrite = redis.NewScript(luascripts.OverridesWrite)

func (r *redisOverrides) version(ctx context.Context) (string, error) {
	s, err := r.client.Get(ctx, r.versionKey).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return s, err
}

func (r *redisOverrides) clock(ctx context.Context) (time.Time, error) {
	return r.client.Time(ctx).Result()
}

// announce is how a change is announced: 0 not at all, 1 on the classic
// channel, 2 on the shard channel too (in a cluster).
func (r *redisOverrides) announce(ctx context.Context) int {
	switch {
	case r.quiet:
		return 0
	case r.cluster: // SPUBLISH too: a node without it (Redis 6) fails it alone (pcall)
		return 2
	}
	return 1
}

func (r *redisOverrides) write(ctx context.Context, zone string, digest *[16]byte, o Override) (bool, delta, error) {
	b, err := json.Marshal(o)
	if err != nil {
		return false, delta{}, err
	}
	name, value := overrideField(zone, digest), string(b)
	if len(name) > maxOverrideName || len(value) > maxOverrideValue {
		return false, delta{}, fmt.Errorf("an override's entry of a %d-byte name and a %d-byte value: at most %d and %d bytes are read back",
			len(name), len(value), maxOverrideName, maxOverrideValue)
	}
	v, err := overridesWrite.Run(ctx, r.client, []string{r.hash, r.versionKey, r.expiry},
		name, value, o.Expires, nonce(), r.announce(ctx), r.channel, o.Stamp.MS, o.Stamp.N, o.Stamp.Origin).Result()
	if err != nil {
		return false, delta{}, err
	}
	reply, ok := v.([]any)
	if !ok || len(reply) < 5 {
		return false, delta{}, fmt.Errorf("%w: overrides write reply %T", errReply, v)
	}
	found, _ := reply[0].(int64)
	d := delta{}
	d.prev, _ = reply[1].(string)
	d.next, _ = reply[2].(string)
	if refused, _ := reply[3].(string); refused != "" && r.unannounced.CompareAndSwap(false, true) && r.ev != nil {
		r.ev.OverridesNotPushed(fmt.Errorf("announcing a change: %s", refused))
	}
	if state, _ := reply[4].(string); state == "written" {
		d.names, d.changes = []string{name}, []entryChange{{zone: zone, digest: digest, o: o}}
	}
	for _, x := range reply[5:] { // the expired entries it dropped
		n, _ := x.(string)
		if z, dg, err := parseOverrideField(n); err == nil {
			d.changes, d.names = append(d.changes, entryChange{zone: z, digest: dg, gone: true}), append(d.names, n)
		}
	}
	return found == 1, d, nil
}

// nonce is a new version's nonce: 8 random bytes, in hex.
func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// shardedChannels reports whether the instances subscribe to the shard
// channel: in a cluster whose nodes know SSUBSCRIBE (Redis 7).
func (r *redisOverrides) shardedChannels(ctx context.Context) bool {
	if !r.cluster {
		return false
	}
	if s := r.sharded.Load(); s != 0 {
		return s == 1
	}
	info, err := r.client.Do(ctx, "COMMAND", "INFO", "SSUBSCRIBE").Slice()
	if err != nil {
		return false // not known yet: the classic channel
	}
	yes := len(info) == 1 && info[0] != nil
	r.sharded.Store(int32(2 - btoi(yes)))
	return yes
}

// watch subscribes to the channel of changes (the shard channel in a
// cluster that has them), queues every change announced, and kicks a read
// on every subscription (go-redis subscribes again after a connection
// drops: what was announced meanwhile is read then), until stop closes. A
// cluster node that loses the channel's slot (a failover, a slot moved)
// ends a shard subscription with a sunsubscribe, which go-redis does not
// make again: watch subscribes again itself. A subscription not confirmed
// within 10s is reported once.
func (r *redisOverrides) watch(stop <-chan struct{}, pushed func(delta), kick func(string), ev Events) {
	reported := false
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sharded := r.shardedChannels(ctx)
		cancel()
		if !r.session(stop, sharded, pushed, kick, ev, &reported) {
			return
		}
		select { // a sunsubscribe: again, after a pause
		case <-stop:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// session is one subscription; it reports whether to subscribe again (the
// node ended it), else stop closed.
func (r *redisOverrides) session(stop <-chan struct{}, sharded bool, pushed func(delta), kick func(string), ev Events, reported *bool) bool {
	var ps *redis.PubSub
	if sharded {
		ps = r.client.SSubscribe(context.Background(), r.channel)
	} else {
		ps = r.client.Subscribe(context.Background(), r.channel)
	}
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(64))
	confirm := time.NewTimer(cmp.Or(r.subscribeTimeout, 10*time.Second))
	defer confirm.Stop()
	for {
		select {
		case <-stop:
			return false
		case <-confirm.C:
			if !*reported {
				*reported = true
				ev.OverridesNotPushed(fmt.Errorf("no confirmation of the subscription to %s", r.channel))
			}
		case m, ok := <-ch:
			if !ok {
				return false
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "sunsubscribe" || m.Kind == "unsubscribe" {
					kick("subscribe")
					return true
				}
				confirm.Stop()
				kick("subscribe")
			case *redis.Message:
				if d, ok := parseDelta(m.Payload); ok {
					pushed(d)
				} else {
					kick("push")
				}
			}
		}
	}
}
