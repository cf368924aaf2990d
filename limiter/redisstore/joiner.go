package redisstore

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Batched script calls. A batch of a node's pipeline may hold the
// decisions of many requests that run the same script, in the same mode,
// at the same time (the server's clock, for most): such commands leave as
// one script call that decides them in turn, each all or nothing on its
// own, and each with its own reply or error (see common.lua). Redis then
// pays once what every call costs (the call, TIME, the script's set-up:
// about a third of a decision's time), and go-redis writes and reads one
// command instead of many. On a standalone or Sentinel Redis, such
// commands that follow each other in the batch join; in a cluster, any
// of a node's batch, of one or several slots (see joinMode); on other
// clients, none. A call is bounded (maxJoinWeight), and no command passes
// an earlier one of its slot.
//
// A call may declare keys of one slot only, so a cluster call of several
// slots declares none: its keys go in its arguments (see common.lua),
// which Redis allows of a script without flags, so long as every key is
// the node's. A request whose keys are not (its slot moved since the
// client's slot map said where it is, or the node is a replica now) fails
// alone in the call, and, unless it did something that would count twice
// (see common.lua's dirty), is sent again alone with its keys declared,
// which Redis redirects (errBatchElsewhere).
//
// Nothing else changes: the batch is sent once (at most once), a failed
// call fails each of its decisions as it would have failed them alone
// (NOSCRIPT, MOVED and ASK are sent again alone), and a request whose keys
// make the script fail gets that error alone.

// evalParts are an EVALSHA command's parts, as evalCmd wrote them.
type evalParts struct {
	sha, now, mode any
	keys           []any // *string, each
	argv           []any // the keys' arguments
	tag            string
}

// parseEval reads the parts of an EVALSHA command of evalCmd; false for
// another command (an EVAL, one of a batch already).
func parseEval(args []any) (evalParts, bool) {
	if len(args) < 5 || args[0] != "evalsha" {
		return evalParts{}, false
	}
	n, ok := args[2].(int)
	if !ok || len(args) != 5+n+argsPerKey*n || n == 0 {
		return evalParts{}, false
	}
	first, ok := args[3].(*string)
	if !ok {
		return evalParts{}, false
	}
	p := evalParts{sha: args[1], keys: args[3 : 3+n], now: args[3+n], mode: args[4+n], argv: args[5+n:]}
	if open := strings.IndexByte(*first, '{'); open >= 0 {
		if end := strings.IndexByte((*first)[open:], '}'); end > 0 {
			p.tag = (*first)[open : open+end]
		}
	}
	return p, true
}

// joinMode says which commands a store's batched calls may join.
type joinMode int

const (
	// joinAny: any adjacent commands (a standalone or Sentinel Redis, where
	// a call may touch any keys, and a command's keys may have many tags).
	joinAny joinMode = iota
	// joinByNode: any commands of a cluster node's batch (each holds one
	// client's keys, of one hash tag), those of several tags in a call
	// that declares no keys.
	joinByNode
	// joinByTag: commands of one hash tag, one slot (in a cluster, the
	// queue of the commands whose node the slot map did not tell, which
	// the cluster client routes by their first key).
	joinByTag
	// joinNone: none (a client of another kind: a ring of shards).
	joinNone
)

// joinKey says which commands may be one call: same script, time and
// mode, and in a cluster the same hash tag.
type joinKey struct {
	sha, now, mode any
	tag            string
}

// maxJoinWeight bounds the work of one batched call, so that it holds
// Redis about as long as a few plain decisions, and other clients' commands
// still come in between: a command weighs its keys, and for the sliding
// log, which adds a member per unit of cost, its costs. A command heavier
// than that is sent alone, as every command was before batching.
const maxJoinWeight = 64

// weight is the work of the command of p (see maxJoinWeight).
func weight(p evalParts) int {
	if p.sha != scripts[bucket.SlidingWindowLog].sha {
		return len(p.keys)
	}
	w := 0
	for a := 3; a < len(p.argv); a += argsPerKey { // each key's cost (see evalCmd)
		c, _ := p.argv[a].(int64)
		w += int(min(max(c, 1), maxJoinWeight+1))
	}
	return w
}

// unit is what one command of a pipeline answers: one item, with its own
// command, or several, with the call that decides them all.
type unit struct {
	key    joinKey
	cmd    onceCmd
	items  []queued    // more than one: a batched call's
	parts  []evalParts // of each item, while they may be joined
	sizes  []int       // the keys of each item, for a batched call
	weight int         // see maxJoinWeight
	tags   bool        // the items are of several hash tags: keys undeclared
	one    [1]queued   // items, for one item (no allocation)
	part   [1]evalParts
}

// joiner groups the live items of a batch into the commands to send; the
// flusher keeps one, so that its room serves every batch.
type joiner struct {
	units []unit
	open  map[joinKey]int // in a cluster, the latest unit of each joinKey
	last  map[string]int  // in a cluster, the unit of the latest item of each hash tag
	// The room the batches reuse: the items and parts of the units that
	// grew past one (spare, once a batch is answered), and the arguments
	// and key counts of the batched calls (args, sizes: room handed out,
	// never moved, until reset).
	spareItems [][]queued
	spareParts [][]evalParts
	args       []any
	sizes      []int
}

// join returns the commands for items: those that may be one call (see
// joinKey) in one call each, within maxJoinWeight, the others alone. No
// command passes an earlier one that shares its slot (a take must not
// pass a release of the same client queued before it): outside a cluster
// (where a command's keys may have many tags), an item joins only the
// unit of the item just before it; in a cluster, the latest unit of its
// joinKey, unless a later one holds an item of its hash tag. The units
// are j's until reset.
func (j *joiner) join(items []queued, mode joinMode) []unit {
	if j.last == nil {
		j.last, j.open = map[string]int{}, map[joinKey]int{}
	}
	for _, it := range items {
		p, ok := parseEval(it.cmd.Args())
		if !ok || mode == joinNone { // not ours to read: nothing joins across it
			clear(j.last)
			clear(j.open)
			j.add(it, p, joinKey{}, maxJoinWeight)
			continue
		}
		k := joinKey{sha: p.sha, now: p.now, mode: p.mode}
		if mode == joinByTag {
			k.tag = p.tag
		}
		w := weight(p)
		u, ok := j.into(k, p.tag, w, mode)
		if ok {
			uu := &j.units[u]
			if len(uu.items) == cap(uu.items) {
				uu.items, uu.parts = j.grow(uu.items, uu.parts)
			}
			uu.items, uu.parts, uu.weight = append(uu.items, it), append(uu.parts, p), uu.weight+w
			uu.tags = uu.tags || p.tag != uu.parts[0].tag
		} else {
			u = len(j.units)
			j.add(it, p, k, w)
		}
		if mode != joinAny {
			j.open[k], j.last[p.tag] = u, u
		}
	}
	for k := range j.units {
		u := &j.units[k]
		if len(u.items) > 1 {
			u.cmd, u.sizes = j.batchCmd(u.items[0].ctx, u.parts, u.tags)
		}
	}
	return j.units
}

// grow returns room for more items and parts than items and parts hold,
// with them copied in: spare room of an earlier batch when there is some
// large enough, else new room (twice as large, at least 8).
func (j *joiner) grow(items []queued, parts []evalParts) ([]queued, []evalParts) {
	need := 2 * len(items)
	var ni []queued
	var np []evalParts
	if n := len(j.spareItems); n > 0 && cap(j.spareItems[n-1]) >= need && cap(j.spareParts[n-1]) >= need {
		ni, np = j.spareItems[n-1], j.spareParts[n-1]
		j.spareItems, j.spareParts = j.spareItems[:n-1], j.spareParts[:n-1]
	} else {
		ni, np = make([]queued, 0, max(need, 8)), make([]evalParts, 0, max(need, 8))
	}
	return append(ni, items...), append(np, parts...)
}

// room returns n elements of room from *arena (handed out, never moved
// until the arena's reset), a new arena when it has too little left.
func room[T any](arena *[]T, n int) []T {
	a := *arena
	if cap(a)-len(a) < n {
		a = make([]T, 0, max(n, 2*cap(a), 256))
	}
	*arena = a[:len(a)+n]
	return a[len(a) : len(a) : len(a)+n]
}

// into returns the unit that a command of joinKey k, hash tag tag and
// weight w may join in mode (see join), and whether there is one.
func (j *joiner) into(k joinKey, tag string, w int, mode joinMode) (int, bool) {
	u, found := len(j.units)-1, len(j.units) > 0
	if mode != joinAny {
		u, found = j.open[k]
		if last, ok := j.last[tag]; ok && last > u {
			return 0, false
		}
	}
	return u, found && j.units[u].key == k && j.units[u].weight+w <= maxJoinWeight
}

// add makes a unit of item it alone, for now.
func (j *joiner) add(it queued, p evalParts, k joinKey, w int) {
	j.units = append(j.units, unit{key: k, cmd: it.cmd, weight: w})
	u := &j.units[len(j.units)-1]
	u.one[0], u.part[0] = it, p
	u.items, u.parts = u.one[:], u.part[:]
}

// reset lets go of the last batch's units (their commands and callers'
// contexts), keeping the room.
func (j *joiner) reset() {
	for _, u := range j.units {
		if cap(u.items) > 1 { // room of its own: spare for the next batches
			clear(u.items)
			clear(u.parts)
			j.spareItems, j.spareParts = append(j.spareItems, u.items[:0]), append(j.spareParts, u.parts[:0])
		}
	}
	clear(j.args)
	j.args, j.sizes = j.args[:0], j.sizes[:0]
	clear(j.units)
	j.units = j.units[:0]
	clear(j.last)
	clear(j.open)
}

// batchCmd is the call that decides, in turn, the commands of ps, which
// may be one call: their keys, the time and mode, their keys' arguments,
// then the number of keys of each (see common.lua). Its keys are declared
// unless undeclared (ps hold several slots' keys: then the call declares
// none, and its arguments start with the number of keys, then the keys).
func (j *joiner) batchCmd(ctx context.Context, ps []evalParts, undeclared bool) (onceCmd, []int) {
	sizes := room(&j.sizes, len(ps))[:len(ps)]
	keys, argv := 0, 0
	for i, p := range ps {
		sizes[i] = len(p.keys)
		keys, argv = keys+len(p.keys), argv+len(p.argv)
	}
	a := room(&j.args, 6+keys+argv+len(ps))
	a = append(a, "evalsha", ps[0].sha, keys)
	if undeclared {
		a = append(a[:2], 0, keys)
	}
	for _, p := range ps {
		a = append(a, p.keys...)
	}
	a = append(a, ps[0].now, ps[0].mode)
	for _, p := range ps {
		a = append(a, p.argv...)
	}
	for _, n := range sizes {
		a = append(a, n)
	}
	return onceCmd{redis.NewIntSliceCmd(ctx, a...)}, sizes
}

// batchError is the error of one request of a batched call that its own
// keys made fail, a Redis error reply (not a sign that the node is
// unavailable).
type batchError string

func (e batchError) Error() string { return string(e) }

// RedisError marks it a Redis error reply (see redis.Error).
func (batchError) RedisError() {}

const (
	errBatchWrongType = batchError("WRONGTYPE Operation against a key holding the wrong kind of value (in a batched script call)")
	errBatchScript    = batchError("ERR the rate limit script failed on this request's keys (in a batched script call)")
	// errBatchElsewhere: the request's keys are not those of the node its
	// batched call went to (its slot moved, the node is a replica now, or
	// the cluster is down); nothing of it ran that would count twice, and
	// the store sends it again alone, with its keys declared (see
	// Store.run).
	errBatchElsewhere = batchError("the keys are not the node's (in a batched script call that declares none)")
)

// answer gives each item of a call of several its own reply or error,
// from the call's (see common.lua's reply); a unit of one item holds its
// own already.
func (u unit) answer() {
	if u.sizes == nil {
		return
	}
	reply, err := u.cmd.Result()
	want := 1
	for _, n := range u.sizes {
		want += 1 + replyPerKey*n
	}
	if err == nil && len(reply) != want {
		err = fmt.Errorf("%w: %d integers for a batch, want %d", errReply, len(reply), want)
	}
	pos := 1
	var own []int64
	for j, it := range u.items {
		end := pos + 1 + replyPerKey*u.sizes[j]
		switch {
		case err != nil:
			it.cmd.SetErr(err)
		case reply[pos] == -1:
			it.cmd.SetErr(errBatchWrongType)
		case reply[pos] == -2:
			it.cmd.SetErr(errBatchScript)
		case reply[pos] == -3:
			it.cmd.SetErr(errBatchElsewhere)
		default: // each its own part of one array
			if own == nil {
				own = make([]int64, 0, len(reply)-1+len(u.items))
			}
			start := len(own)
			own = append(append(own, reply[0]), reply[pos:end]...)
			it.cmd.SetVal(own[start:len(own):len(own)])
		}
		pos = end
	}
}

// unanswered gives err, a pipeline's, to the commands of us that hold
// neither a reply nor an error of their own: those go-redis never sent,
// as when the connection's handshake failed (a wrong password).
func unanswered(us []unit, err error) {
	if err == nil {
		return
	}
	for _, u := range us {
		if u.cmd.Err() == nil && len(u.cmd.Val()) == 0 {
			u.cmd.SetErr(err)
		}
	}
}

// evalAgain sends the calls of us that found no script cached (NOSCRIPT:
// they did not run; a node restarted or was promoted) once more, as EVAL
// with the script's source, which caches it, on pipe, the node's (idle,
// its batch answered): all in one pipeline, in their order, so that no
// call passes an earlier one of its slot (a take joined with others must
// not pass a release of its client alone in its call). A call of several
// decisions is one command, instead of each of them sent again alone
// with the source; a call of one gives its reply to its caller's command.
func evalAgain(ctx context.Context, pipe redis.Pipeliner, us []unit) {
	again := 0
	for k := range us {
		u := &us[k]
		if !redis.HasErrorPrefix(u.cmd.Err(), "NOSCRIPT") {
			continue
		}
		args := u.cmd.Args()
		for _, s := range scripts {
			if s.sha == args[1] {
				u.cmd = onceCmd{redis.NewIntSliceCmd(ctx, append([]any{"eval", s.src}, args[2:]...)...)}
				_ = pipe.Process(ctx, u.cmd)
				again++
				break
			}
		}
	}
	if again == 0 {
		return
	}
	_, err := pipe.Exec(ctx) // each command holds its own reply or error
	unanswered(us, err)
	for _, u := range us {
		if own := u.items[0].cmd; u.sizes == nil && own.IntSliceCmd != u.cmd.IntSliceCmd {
			v, err := u.cmd.Result()
			own.SetVal(v)
			own.SetErr(err)
		}
	}
}
