package main

import (
	"fmt"
	"strings"
	"time"
)

// line is the run's one line: key=value fields, the run's shape first,
// then its cost, then its accuracy, then what failed (see the package
// doc).
func (r result) line(c config) string {
	var b strings.Builder
	field := func(k string, format string, args ...any) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k + "=" + fmt.Sprintf(format, args...))
	}
	field("mode", "%s", c.mode)
	field("instances", "%d", c.instances)
	field("regions", "%d", len(c.regions))
	field("keys", "%d", c.keys)
	field("zipf", "%g", c.zipf)
	field("rate", "%s", c.rate)
	field("burst", "%d", c.policy.Burst)
	switch c.mode {
	case modeSync:
		field("sync", "%s", c.sync)
	case modeRegions:
		field("exchange", "%s", c.exchange)
	}
	field("workers", "%d", c.workers)
	if c.qps > 0 {
		field("qps", "%g", c.qps)
	}
	field("duration", "%s", r.w.elapsed.Round(time.Millisecond))
	field("setup", "%s", r.setup.Round(time.Millisecond))
	r.cost(field)
	r.accuracy(field)
	r.lat.fields(field)
	field("fallback", "%d", r.fellBack)
	field("errors", "%d", r.ev.failures.Load()+r.ev.scripts.Load())
	if c.mode == modeSync {
		field("rounds", "%d/%d", r.ev.roundsOK.Load(), r.ev.roundsFail.Load())
	}
	if c.mode == modeRegions {
		field("exchanges", "%d/%d", r.ev.exchOK.Load(), r.ev.exchFail.Load())
		field("links_down", "%d", r.ev.linksDown.Load())
	}
	if r.behind > 0 {
		field("behind", "%d", r.behind)
	}
	if e, ok := r.ev.lastErr.Load().(string); ok {
		field("last_error", "%q", e)
	}
	return b.String()
}

// cost adds the fields of the run's cost: throughput, CPU, memory.
func (r result) cost(field func(string, string, ...any)) {
	d := float64(max(r.w.decisions, 1))
	field("decisions/s", "%.0f", float64(r.w.decisions)/r.w.elapsed.Seconds())
	us := func(t time.Duration) float64 { return float64(t) / float64(time.Microsecond) / d }
	field("gw_us", "%.2f", us(r.w.cpu)-float64(r.gen)/float64(time.Microsecond))
	field("gen_us", "%.2f", float64(r.gen)/float64(time.Microsecond))
	field("redis_us", "%.2f", us(r.w.redisCPU))
	field("redis_idle", "%.1fms/s", float64(r.idle)/float64(time.Millisecond))
	keys := r.w.peak.keys - r.before.keys
	if keys >= minKeysForMemory {
		field("redis_B/key", "%.0f", float64(r.w.peak.mem-r.before.mem)/float64(keys))
	} else {
		field("redis_B/key", "-")
	}
	field("keys_peak", "%d", keys)
	field("key_usage_B", "%.0f", r.w.usage)
}

// minKeysForMemory is the fewest keys whose memory is told per key: below,
// the noise of Redis's own memory (its hash tables growing in powers of
// two, its Lua heap, its cluster links: tens of kB a node) outweighs
// them.
const minKeysForMemory = 10_000

// accuracy adds the fields of the run's accuracy against the exact
// replay.
func (r result) accuracy(field func(string, string, ...any)) {
	a := r.acc
	pct := func(n, of int64) string {
		if of == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f%%", 100*float64(n)/float64(of))
	}
	field("keys_sent", "%d", a.keys)
	field("admitted", "%s", pct(a.admitted, a.requests))
	field("exact", "%s", pct(a.exact, a.requests))
	field("over_max", "%d", a.overMax)
	field("bound", "%.0f", r.bound)
	field("keys_over_bound", "%d", a.overKeys)
	field("over_sum", "%s", pct(a.overSum, a.exact))
	field("refused_within", "%s", pct(a.refusedWithin, a.within))
	field("refused_beyond", "%s", pct(a.under, a.requests))
	field("load", "%s/%s/%s", pct(a.load[loadUnder], a.requests), pct(a.load[loadNear], a.requests), pct(a.load[loadOver], a.requests))
}
