package limiter

// The script commands of the Redis store and their replies.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// evalCmd is the command of sr: an EVALSHA, or an EVAL (with the script's
// source) when sha is false, of its keys, then the time, the mode, and the
// arguments of each key.
func evalCmd(ctx context.Context, sr scriptRun, sha bool, now, mode string, reqs []Request) onceCmd {
	a := make([]any, 0, 5+len(sr.keys)+argsPerKey*len(sr.idx))
	if sha {
		a = append(a, "evalsha", sr.script.sha)
	} else {
		a = append(a, "eval", sr.script.src)
	}
	a = append(a, len(sr.keys))
	for _, k := range sr.keys {
		a = append(a, k)
	}
	a = append(a, now, mode)
	for _, i := range sr.idx {
		p := reqs[i].Policy
		period := p.Period.Microseconds()
		if p.Algorithm == Concurrency {
			period = p.Lease.Microseconds()
		}
		nodelay := 0
		if p.NoDelay {
			nodelay = 1
		}
		pa := policyArgs(p.Rate, period, p.Burst)
		a = append(a, pa[0], pa[1], pa[2], reqs[i].Cost, nodelay, reqs[i].ID)
	}
	return onceCmd{redis.NewCmd(ctx, a...)}
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
func decode(v any, idx []int, reqs []Request, decisions []Decision) (bool, error) {
	list, ok := v.([]any)
	if !ok || len(list) != 2+replyPerKey*len(idx) {
		_, err := replyInts(v, 2+replyPerKey*len(idx))
		return false, err
	}
	var head [2]int64
	if err := readInts(list[:2], head[:]); err != nil {
		return false, err
	}
	var r [replyPerKey]int64
	for j, i := range idx {
		if err := readInts(list[2+replyPerKey*j:2+replyPerKey*(j+1)], r[:]); err != nil {
			return false, err
		}
		decisions[i] = Decision{
			Allowed:    r[0] == 1,
			Limit:      reqs[i].Policy.Limit(),
			Remaining:  r[1],
			Reset:      time.UnixMicro(head[0] + r[2]),
			RetryAfter: time.Duration(r[3]) * time.Microsecond,
			Delay:      time.Duration(r[4]) * time.Microsecond,
			At:         time.UnixMicro(head[0]),
		}
	}
	return head[1] == 1, nil
}

// readInts reads the integers of list into dst, which has its length.
func readInts(list []any, dst []int64) error {
	for k, x := range list {
		n, ok := x.(int64)
		if !ok {
			return fmt.Errorf("%w: element %d is %T", errReply, k, x)
		}
		dst[k] = n
	}
	return nil
}
