package ratelimit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// caddy-ratelimit's spelling (github.com/mholt/caddy-ratelimit), accepted
// next to ours: a zone's events (JSON max_events) and window, zones
// without a key, prefixes of 0, and the handler's rate_limits, log_key,
// jitter, disable_metrics and sweep_interval; its distributed and storage
// (distributed.go).

// PrefixLength is the length in bits of the network prefix by which keys
// that are IP addresses are grouped. In JSON it is a number; 0 means no
// grouping (each address alone), and an absent field the zone's default.
// In Go, the zero value is "not set" and noGrouping an explicit 0.
type PrefixLength int

// noGrouping is a PrefixLength set to 0 in the config: no grouping.
const noGrouping PrefixLength = -1

// UnmarshalJSON reads a prefix length; 0 is noGrouping.
func (p *PrefixLength) UnmarshalJSON(b []byte) error {
	var n int
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("prefix length %d: want 0 (no grouping) or a number of bits", n)
	}
	*p = PrefixLength(n)
	if n == 0 {
		*p = noGrouping
	}
	return nil
}

// MarshalJSON writes noGrouping as 0 (the zero value, "not set", is
// omitted by omitempty).
func (p PrefixLength) MarshalJSON() ([]byte, error) {
	return json.Marshal(max(int(p), 0))
}

// bits is the prefix length in force: def when not set, all (every
// address alone) for no grouping.
func (p PrefixLength) bits(def, all int) int {
	switch p {
	case 0:
		return def
	case noGrouping:
		return all
	}
	return int(p)
}

// checkEvents checks caddy-ratelimit's spelling of a limit: events (JSON
// max_events) within window, instead of a rate.
func (z *Zone) checkEvents() error {
	switch {
	case z.MaxEvents == 0 && z.Window == 0:
		return nil
	case z.Rate != "":
		return about(fmt.Errorf("rate and events/window both set the limit: use one of them"), "rate", "events")
	case z.MaxEvents < 1:
		return about(fmt.Errorf("window needs events (JSON max_events): a number of at least 1"), "window")
	case z.Window == 0:
		return about(fmt.Errorf("events %d needs a window: events <N> with window <duration>", z.MaxEvents), "events")
	case time.Duration(z.Window) < time.Millisecond || time.Duration(z.Window) > bucket.MaxPeriod:
		return about(fmt.Errorf("window %s: want 1ms to 100 years", time.Duration(z.Window)), "window")
	case z.Algorithm == "" && z.MaxEvents > maxLogLimit:
		return about(fmt.Errorf("events %d: the sliding log keeps one entry per event, at most %d per key; "+
			"for more, add algorithm sliding_window_counter (two counters, close to exact)", z.MaxEvents, maxLogLimit), "events")
	}
	return nil
}

// algorithm is the name of the zone's algorithm: as configured; else the
// sliding log for events and window (caddy-ratelimit's algorithm), the
// token bucket for a rate.
func (z *Zone) algorithm() string {
	if z.Algorithm == "" && z.MaxEvents != 0 {
		return limiter.SlidingWindowLog.String()
	}
	return z.Algorithm
}

// maxJitter bounds Jitter: a fraction of the wait.
const maxJitter = 1

// provisionCompat checks caddy-ratelimit's handler options and gives
// them their meaning here: rate_limits join the zones, log_key is
// log_keys, disable_metrics leaves the zones out of the metrics.
func (h *Handler) provisionCompat() error {
	switch {
	case !(h.Jitter >= 0 && h.Jitter <= maxJitter): // NaN too
		return fmt.Errorf("jitter %v: want a fraction of the wait from 0 to %d (0.2 adds up to 20%%)", h.Jitter, maxJitter)
	case h.SweepInterval < 0:
		return fmt.Errorf("sweep_interval %s: want a positive duration", time.Duration(h.SweepInterval))
	}
	h.LogKeys = h.LogKeys || h.LogKey
	for name, z := range h.RateLimits {
		if _, dup := h.Zones[name]; dup {
			return fmt.Errorf("zone %q is both in zones and in rate_limits", name)
		}
		if h.Zones == nil {
			h.Zones = make(map[string]*Zone, len(h.RateLimits))
		}
		h.Zones[name] = z
	}
	for _, z := range h.Zones {
		if z != nil {
			z.noMetrics = h.DisableMetrics
		}
	}
	h.compatDefaults()
	return nil
}

// compatRefusalLogInterval is log_refusals' interval for a handler in
// caddy-ratelimit's spelling: close to its line per refusal, with a bound.
const compatRefusalLogInterval = time.Second

// compatDefaults gives a handler written in caddy-ratelimit's spelling (every
// zone a number of events in a window) caddy-ratelimit's responses,
// unless an option of ours says otherwise: the 429 goes to handle_errors
// (response), allowed responses get no limit headers and refusals only
// Retry-After (headers), and refusals are logged at info level with its
// message and fields (log_refusals, at most one line per client and zone
// a second).
func (h *Handler) compatDefaults() {
	if len(h.Zones) == 0 {
		return
	}
	for _, z := range h.Zones {
		if z == nil || z.MaxEvents == 0 && z.Window == 0 {
			return
		}
	}
	h.Response = cmp.Or(h.Response, "handle_errors")
	h.Headers = cmp.Or(h.Headers, "none")
	if h.LogRefusals == nil {
		h.LogRefusals, h.compatLog = &RefusalLog{Interval: caddy.Duration(compatRefusalLogInterval)}, true
	}
}
