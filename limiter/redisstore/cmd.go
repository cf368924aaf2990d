package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// The script commands of the Redis store and their replies.

// evalCmd is the command of sr: an EVALSHA, or an EVAL (with the script's
// source) when sha is false, of its keys, then the time, the mode, and the
// arguments of each key (its flag is sr.flags' when set: a refund's take).
// Its arguments go in buf when it has the room (a command's arguments are
// read until it is sent: buf must not serve two commands that may be in
// flight at once); the keys are passed as pointers into sr.keys, which
// must not change until then either.
func evalCmd(ctx context.Context, sr scriptRun, sha bool, now string, mode scriptMode, reqs []bucket.Request, buf []any) onceCmd {
	a := buf[:0]
	if n := 5 + len(sr.keys) + argsPerKey*len(sr.idx); cap(a) < n {
		a = make([]any, 0, n)
	}
	if sha {
		a = append(a, "evalsha", sr.script.sha)
	} else {
		a = append(a, "eval", sr.script.src)
	}
	a = append(a, len(sr.keys))
	for i := range sr.keys {
		a = append(a, &sr.keys[i]) // a pointer: no copy of the string on the heap
	}
	a = append(a, now, modeArg(mode))
	for j, i := range sr.idx {
		p := reqs[i].Policy
		period, burst := p.Period.Microseconds(), p.Burst
		if p.Algorithm == bucket.Concurrency { // concurrency.lua: the slots as the burst, the lease as the period
			period, burst = p.Lease.Microseconds(), p.Slots
		}
		var flag any = 0
		switch {
		case sr.flags != nil:
			flag = sr.flags[j]
		case p.NoDelay:
			flag = 1
		case reqs[i].Sync > 0 && p.Algorithm.Windowed() && p.Algorithm != bucket.Quota:
			flag = 2 // a window that syncs: what its charges put past the limit carries (see carry in common.lua)
		}
		var id any = reqs[i].ID
		if p.Algorithm == bucket.Quota { // quota.lua: the periods around this clock's reading, after a global zone's tag
			id = quotaPeriods(p.Calendar, now, reqs[i])
		}
		pa := policyArgs(p.Rate, period, burst)
		a = append(a, pa[0], pa[1], pa[2], reqs[i].Cost, flag, id)
	}
	if sr.pooled != nil && sr.pooled.cmd.Args() == nil { // the command lives in the run's room
		sr.pooled.cmd = *redis.NewIntSliceCmd(ctx, a...)
		return onceCmd{&sr.pooled.cmd}
	}
	return onceCmd{redis.NewIntSliceCmd(ctx, a...)}
}

// wallClock is this gateway's clock, which a quota's periods are
// computed from (tests set it off Redis's).
var wallClock = time.Now

// quotaPeriods is quota.lua's id argument for r, a quota of calendar c:
// the starts of the periods before, at and after now (the time of the
// call in µs, or "" for this clock), and the end of the next, in µs;
// after r's ID and "/" when r is a global zone's (its tag: see
// limiter/regions).
func quotaPeriods(c bucket.Calendar, now string, r bucket.Request) string {
	t := wallClock()
	if us, err := strconv.ParseInt(now, 10, 64); err == nil {
		t = time.UnixMicro(us)
	}
	b := c.Around(t)
	var room [128]byte
	s := room[:0]
	if r.Global && r.ID != "" {
		s = append(append(s, r.ID...), '/')
	}
	for i, x := range b {
		if i > 0 {
			s = append(s, ':')
		}
		s = strconv.AppendInt(s, x.UnixMicro(), 10)
	}
	return string(s)
}

// scriptMode is what a bucket script does with its keys: its ARGV[2] (see
// common.lua), sent as the string it is.
type scriptMode string

// The bucket scripts' modes.
const (
	modeTake    scriptMode = "take"    // charge the costs if every key allows them
	modeRefund  scriptMode = "refund"  // give back what a take still holds back
	modePeek    scriptMode = "peek"    // read, change nothing
	modeRelease scriptMode = "release" // give back concurrency slots
	modeRenew   scriptMode = "renew"   // extend concurrency leases still held
	modeCharge  scriptMode = "charge"  // charge the costs whatever the keys hold
)

// modeArgs are the scripts' modes as command arguments: plain strings,
// boxed once.
var modeArgs = map[scriptMode]any{modeTake: string(modeTake), modeRefund: string(modeRefund),
	modePeek: string(modePeek), modeRelease: string(modeRelease), modeRenew: string(modeRenew),
	modeCharge: string(modeCharge)}

// modeArg is mode as a command argument (a string), without an allocation
// for the modes the store uses.
func modeArg(mode scriptMode) any {
	if v, ok := modeArgs[mode]; ok {
		return v
	}
	return string(mode)
}

// boxedPolicies holds the rate, period and burst of policies as command
// arguments, so that a zone's numbers are not converted on every call. It
// keeps at most maxBoxedPolicies (policies can come from placeholders).
var boxedPolicies sync.Map // [3]int64 → *[3]any

var boxedCount atomic.Int32

const maxBoxedPolicies = 4096

// policyArgs are rate, period and burst as command arguments.
func policyArgs(rate, period, burst int64) *[3]any {
	k := [3]int64{rate, period, burst}
	if v, ok := boxedPolicies.Load(k); ok {
		return v.(*[3]any)
	}
	v := &[3]any{rate, period, burst}
	if boxedCount.Load() < maxBoxedPolicies {
		if _, loaded := boxedPolicies.LoadOrStore(k, v); !loaded {
			boxedCount.Add(1)
		}
	}
	return v
}

var errReply = errors.New("unexpected reply from the rate limit script")

// replyInts checks that v is a list of n integers.
func replyInts(v any, n int) ([]int64, error) {
	list, ok := v.([]any)
	if !ok || len(list) != n {
		return make([]int64, n), fmt.Errorf("%w: %T of %d", errReply, v, len(list))
	}
	ints := make([]int64, n)
	for i, x := range list {
		if ints[i], ok = x.(int64); !ok {
			return ints, fmt.Errorf("%w: element %d is %T", errReply, i, x)
		}
	}
	return ints, nil
}

// decode fills the decisions of the requests idx from a script reply and
// reports whether the run allowed them all.
func decode(list []int64, idx []int, reqs []bucket.Request, decisions []bucket.Decision) (bool, error) {
	if want := 2 + replyPerKey*len(idx); len(list) != want {
		return false, fmt.Errorf("%w: %d integers, want %d", errReply, len(list), want)
	}
	head := list[:2]
	for j, i := range idx {
		r := list[2+replyPerKey*j : 2+replyPerKey*(j+1)]
		decisions[i] = bucket.Decision{
			Allowed:    r[0] == 1,
			Limit:      reqs[i].Policy.Limit(),
			Remaining:  r[1],
			Reset:      time.UnixMicro(head[0] + r[2]),
			RetryAfter: time.Duration(r[3]) * time.Microsecond,
			Delay:      time.Duration(r[4]) * time.Microsecond,
			At:         time.UnixMicro(head[0]),
		}
		if reqs[i].Policy.Algorithm == bucket.Quota { // quota.lua's count in delay's place
			decisions[i].Delay, decisions[i].Used = 0, r[4]
		}
	}
	return head[1] == 1, nil
}
