package main

import (
	"slices"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// accuracy is a run's decisions against the exact replay of the same
// arrivals.
type accuracy struct {
	requests, admitted, exact int64 // requests; admitted by the fleet, by the replay
	keys                      int   // keys that sent
	overMax                   int64 // the largest excess of a key's admissions over the replay's
	overKeys                  int   // keys whose excess is beyond the bound
	overSum                   int64 // the excesses, added up
	within, refusedWithin     int64 // requests of keys the replay admitted wholly; of them, refused
	under                     int64 // what the replay admitted beyond the fleet, added up over the keys
	load                      [3]int64
}

// The classes of a key's load, against what the exact limit admits over
// the run (burst + rate × run).
const (
	loadUnder = iota // at most half of it
	loadNear         // half to twice
	loadOver         // beyond twice
)

// replay sorts recs (records of the run, from its start, at base) by key
// and time, replays each key's arrivals through one token bucket of p
// (the zone's whole rate and burst), and compares the fleet's admissions
// with the replay's: span is the run's length, bound the mode's.
func replay(recs []uint64, p bucket.Policy, base time.Time, span time.Duration, bound float64) accuracy {
	slices.Sort(recs)
	var acc accuracy
	for i := 0; i < len(recs); {
		key, _, _ := unrecord(recs[i])
		j := i
		for j < len(recs) && int(recs[j]>>33) == key {
			j++
		}
		acc.add(replayKey(recs[i:j], p, base), p, span, bound)
		i = j
	}
	return acc
}

// keyCounts are one key's requests, and what the fleet and the replay
// admitted of them.
type keyCounts struct{ requests, admitted, exact int64 }

// replayKey replays one key's records, in time order, through a token
// bucket of p.
func replayKey(recs []uint64, p bucket.Policy, base time.Time) keyCounts {
	var st bucket.State
	known := false
	var n keyCounts
	for _, r := range recs {
		_, at, admitted := unrecord(r)
		var d bucket.Decision
		st, d = p.Take(st, known, base.Add(at).UnixNano(), 1)
		known = true
		n.requests++
		if admitted {
			n.admitted++
		}
		if d.Allowed {
			n.exact++
		}
	}
	return n
}

// add counts one key's counts into acc.
func (acc *accuracy) add(n keyCounts, p bucket.Policy, span time.Duration, bound float64) {
	acc.keys++
	acc.requests += n.requests
	acc.admitted += n.admitted
	acc.exact += n.exact
	over := n.admitted - n.exact
	acc.overMax = max(acc.overMax, over)
	if float64(over) > bound {
		acc.overKeys++
	}
	acc.overSum += max(over, 0)
	acc.under += max(-over, 0)
	if n.exact == n.requests {
		acc.within += n.requests
		acc.refusedWithin += n.requests - n.admitted
	}
	limit := float64(p.Burst) + float64(p.Rate)*span.Seconds()/p.Period.Seconds()
	switch r := float64(n.requests) / limit; {
	case r <= 0.5:
		acc.load[loadUnder] += n.requests
	case r <= 2:
		acc.load[loadNear] += n.requests
	default:
		acc.load[loadOver] += n.requests
	}
}
