package limiter

import (
	"fmt"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
)

// State is what a Verdict says of one zone of a request.
type State uint8

const (
	// NotAsked: the zone was not decided, since another zone refused first
	// (a ban, or the cache of refused clients). Its Decision is zero.
	NotAsked State = iota
	// Allowed: the zone let the request pass and charged it.
	Allowed
	// Refused: the zone refused the request; no zone charged it.
	Refused
	// Banned: the client is banned in the zone; nothing was charged.
	Banned
	// BanStarted: the zone refused the request, and this refusal started
	// the client's ban (its Decision is the ban's refusal).
	BanStarted
	// WouldRefuse: a dry-run zone would have refused the request; it lets
	// it pass.
	WouldRefuse
	// Unlimited: the store failed and the fallback lets the request pass
	// unlimited (on_store_error allow). Its Decision is zero.
	Unlimited
	// Denied: the store failed and the fallback refuses the request
	// (on_store_error deny). Its Decision is zero.
	Denied
)

var stateNames = [...]string{"not asked", "allowed", "refused", "banned", "ban started", "would refuse", "unlimited", "denied"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// Decided reports whether the zone has a Decision to show.
func (s State) Decided() bool { return s >= Allowed && s <= WouldRefuse }

// Refuses reports whether the zone refuses the request.
func (s State) Refuses() bool { return s == Refused || s == Banned || s == BanStarted || s == Denied }

// Fallback is what a Limiter does with a request its store could not
// decide (Redis unreachable, timed out, a node's breaker open, a script
// that failed): on_store_error.
type Fallback struct {
	// Mode is FallbackLocal (the default), FallbackAllow or FallbackDeny.
	Mode FallbackMode
	// Instances divides every limit in FallbackLocal: the number of
	// instances that share it. At least 1.
	Instances int
}

// FallbackMode is the mode of a Fallback.
type FallbackMode uint8

const (
	// FallbackLocal decides in this instance's memory, each limit divided
	// by Fallback.Instances.
	FallbackLocal FallbackMode = iota
	// FallbackAllow lets requests pass unlimited (fail open).
	FallbackAllow
	// FallbackDeny refuses requests (fail closed).
	FallbackDeny
)

// Failure is why a Verdict's store did not decide.
type Failure uint8

const (
	// NoFailure: the store decided.
	NoFailure Failure = iota
	// StoreUnavailable: Redis did not answer in time, refused the
	// connection, or a node's breaker was open.
	StoreUnavailable
	// ScriptFailed: a script failed in a Redis that answered, from its
	// request's data; it counts toward no breaker.
	ScriptFailed
)

// Verdict is what a Limiter decided for the zones of one request: a State
// and a Decision per zone, in the order of the requests decided.
type Verdict struct {
	// Requests are the zones' requests decided; States[i] is what zone i
	// did, and Decisions[i] its decision when States[i].Decided().
	Requests  []Request
	States    []State
	Decisions []Decision
	// Calls are the store calls made: Calls[0] for the enforced zones,
	// Calls[1] for the dry-run ones (see CallOf).
	Calls [2]Call
	// release gives back the concurrency slots taken; nil when none were.
	release func()
	// room is where the stores write the decisions, kept by Reset for the
	// next verdict (Decisions may be in it).
	room room
}

// room is what a verdict keeps for the next one's decisions: where the
// memory store writes them, and the take of the allowances of the zones
// that sync (fleetsync.Taken).
type room struct {
	decisions []Decision
	taken     fleetsync.Taken
}

// Reset empties v for another request's verdict, keeping the room of its
// States and Decisions (each store clears what it uses of it).
func (v *Verdict) Reset() {
	v.room.taken.Reset()
	*v = Verdict{States: v.States[:0], room: v.room}
}

// Release gives back the concurrency slots the verdict's request holds,
// when it ends. Calling it on a verdict that holds none does nothing; it
// must be called once.
func (v *Verdict) Release() {
	if v.release != nil {
		v.release()
		v.release = nil
	}
}

// CallOf is the store call that decided zone i.
func (v *Verdict) CallOf(i int) *Call {
	if v.Requests[i].DryRun {
		return &v.Calls[1]
	}
	return &v.Calls[0]
}

// Refused reports whether a zone refuses the request.
func (v *Verdict) Refused() bool {
	for _, s := range v.States {
		if s.Refuses() {
			return true
		}
	}
	return false
}

// BansStarted reports whether a zone's refusal started a ban.
func (v *Verdict) BansStarted() bool {
	for _, s := range v.States {
		if s == BanStarted {
			return true
		}
	}
	return false
}

// Shown is the index of the zone whose decision the client is shown,
// among the enforced zones (dryRun false) or the dry-run ones: the most
// restrictive decided zone, or -1 when none is decided.
func (v *Verdict) Shown(dryRun bool) int {
	best := -1
	for i, s := range v.States {
		if !s.Decided() || v.Requests[i].DryRun != dryRun {
			continue
		}
		if best < 0 || v.Decisions[i].MoreRestrictive(v.Decisions[best]) {
			best = i
		}
	}
	return best
}

// MaxDelay is the longest wait an enforced leaky bucket asks of the
// request before it goes on.
func (v *Verdict) MaxDelay() time.Duration {
	var d time.Duration
	for i, s := range v.States {
		if s == Allowed && !v.Requests[i].DryRun {
			d = max(d, v.Decisions[i].Delay)
		}
	}
	return d
}

var fallbackNames = [...]string{"local", "allow", "deny"}

func (m FallbackMode) String() string {
	if int(m) < len(fallbackNames) {
		return fallbackNames[m]
	}
	return fmt.Sprintf("FallbackMode(%d)", m)
}
