package e2e

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// Stalls of a loaded machine. On a busy 2-core machine, Caddy, Redis and
// the test stall for 100-300ms now and then. A decision caught in a stall
// waits out the timeout (chaosTimeout) and fails over to on_store_error,
// 503; three of them open the node's breaker, as they must for a hung
// Redis, and for its cool-down the breaker refuses that node's keys with
// 503 at once. The chaos tests excuse such failures, and only them: a 503
// that waited out the timeout, or that came within stallWindow after the
// end of one that did on the same node. Every other failure (a fast 503,
// no answer) is a defect. A test that excuses stalls judges each node's
// keys apart (see stalls), logs how many decisions waited out the timeout,
// and waits until the windows end before its exact checks.

// stallWindow is how long a node's breaker may refuse after a decision
// that waited out the timeout: its cool-down, and a probe that may wait
// out the timeout again.
const stallWindow = redisstore.BreakerCooldown + chaosTimeout

// stallVerdict judges the failures of a load's results on one node.
type stallVerdict struct {
	slow        int           // failures that waited out the timeout
	last        time.Duration // the last failure that no stall explains; -1: none
	unexplained []result      // such failures from the time given on
	quiet       time.Duration // when the last stall's window ends (that time, at least)
}

// failed reports whether r is a failure: a status other than a decision
// (200, or 429 of a limit), or no answer.
func failed(r result) bool {
	return r.status != http.StatusOK && r.status != http.StatusTooManyRequests
}

// waitedOut reports whether r is a 503 that waited out the timeout: a
// decision caught in a stall (or in a hung Redis).
func waitedOut(r result) bool {
	return r.status == http.StatusServiceUnavailable && r.took >= chaosTimeout
}

// stalls sorts results (of keys on one node) by time and judges their
// failures from since on: those that waited out the timeout (slow), then
// those within stallWindow after the end of a slow one, are explained by
// stalls. The others after the time after are unexplained.
func stalls(results []result, since, after time.Duration) stallVerdict {
	slices.SortFunc(results, func(a, b result) int { return cmp.Compare(a.at, b.at) })
	v := stallVerdict{last: -1, quiet: after}
	var window time.Duration // the end of the latest stall's window
	for _, r := range results {
		switch {
		case r.at < since || !failed(r):
		case waitedOut(r):
			v.slow++
			window = max(window, r.at+r.took+stallWindow)
			v.quiet = max(v.quiet, window)
		case r.at >= window:
			v.last = r.at
			if r.at >= after {
				v.unexplained = append(v.unexplained, r)
			}
		}
	}
	return v
}

// report fails t with (at most 5 of) the failures of v that no stall
// explains, as of what (a node's keys) and after when.
func (v stallVerdict) report(t *testing.T, what, when string) {
	t.Helper()
	for _, r := range v.unexplained[:min(len(v.unexplained), 5)] {
		t.Errorf("%s: status %d at %s (in %s), %s, and not within %s after a decision that waited out the %s timeout%s",
			what, r.status, r.at, r.took, when, stallWindow, chaosTimeout, noAnswer(r.err))
	}
}

// afterRestart judges the results of a load during which Redis came back
// at up: back is how long after up the first decision by Redis came (-1:
// none), and the failures are judged from up on, those from up+bound on
// unexplained unless a stall explains them (see stalls).
func afterRestart(results []result, up, bound time.Duration) (back time.Duration, v stallVerdict) {
	v = stalls(results, up, up+bound)
	back = -1
	for _, r := range results {
		if r.at >= up && r.status == http.StatusOK {
			back = r.at - up
			break
		}
	}
	return back, v
}

// waitQuiet sleeps until the load that began at began is quiet by every
// verdict: no breaker that stalls opened may still refuse.
func waitQuiet(began time.Time, verdicts ...stallVerdict) {
	var quiet time.Duration
	for _, v := range verdicts {
		quiet = max(quiet, v.quiet)
	}
	time.Sleep(time.Until(began.Add(quiet)))
}

// noAnswer says why there was no answer, if err says.
func noAnswer(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// exactlyAfter is exactly after a load, but for stalls: when a request of
// the key waits out the timeout (its script may have run: the key's count
// is lost), it waits out the breaker that stalls may have opened and
// starts again on a new key, up to 3 keys. Any other wrong status fails.
func exactlyAfter(t *testing.T, when, base, key string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		k := key
		if attempt > 1 {
			k = fmt.Sprintf("%s-%d", key, attempt)
		}
		i, r, want := exactRun(base, k)
		switch {
		case r.status == want:
			return
		case waitedOut(r) && attempt < 3:
			t.Logf("%s: key %s request %d on /exact waited out the %s timeout (in %s): again on a new key after %s",
				when, k, i, chaosTimeout, r.took, stallWindow)
			time.Sleep(stallWindow)
		default:
			t.Fatalf("%s: key %s request %d on /exact: status %d (in %s); want %d%s", when, k, i, r.status, r.took, want, noAnswer(r.err))
		}
	}
}
