package regions

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Regions must agree on what they share: the digests of the client keys
// (a key_secret) and each global zone's key template and limit. Regions
// that disagree multiply the limit silently: digests under two secrets
// name two buckets for one client, and a zone's rate or burst that
// differs is charged and decided by two rules. So the mark a region
// writes in a peer's Redis carries its Fingerprint, and a region whose
// mark in this region's Redis differs from this one's is not heard: this
// region decides with its share, charges it nothing, and reports it once
// (Events.ConfigDiffers, naming what differs) until they agree. The peer
// reads this region's mark in its own Redis, and does the same. A
// rollout that changes a global zone, the key_secret, or the set of
// global zones, region by region, is such a difference until every
// region has it. A mark without a fingerprint that can be read (another
// version, a hostile writer) differs too.

// Fingerprint is what the regions of global zones must agree on, as
// digests: no secret, no client key.
type Fingerprint struct {
	// Secret is a digest made with the key secret of the client keys'
	// digests (the same for every region without one).
	Secret string `json:"s"`
	// Zones are the global zones by name: a digest of each one's key
	// template, and one of its algorithm, rate and burst.
	Zones map[string]ZoneFingerprint `json:"z,omitempty"`
}

// ZoneFingerprint is a global zone's: digests of its key template and of
// its limit (algorithm, rate and burst).
type ZoneFingerprint struct {
	Key   string `json:"k"`
	Limit string `json:"l"`
}

// maxMark bounds a mark read from Redis, in bytes: a fingerprint of about
// a thousand zones.
const maxMark = 64 << 10

// Mark is f as a mark's value.
func (f Fingerprint) Mark() string {
	b, _ := json.Marshal(markValue{Version: 1, Fingerprint: f}) // strings and maps of strings: never fails
	return string(b)
}

// markValue is a mark as stored.
type markValue struct {
	Version int `json:"v"`
	Fingerprint
}

// parseMark reads a mark's value; false when it cannot be read.
func parseMark(v string) (Fingerprint, bool) {
	var m markValue
	if len(v) > maxMark || json.Unmarshal([]byte(v), &m) != nil || m.Version != 1 {
		return Fingerprint{}, false
	}
	return m.Fingerprint, true
}

// differs says what differs between f (this region's) and the peer's
// mark v, in a few words naming the zones ("" when they agree).
func (f Fingerprint) differs(v string) string {
	o, ok := parseMark(v)
	if !ok {
		return "its mark carries no fingerprint this version can read (another version of the module, or not written by one)"
	}
	var diffs []string
	if f.Secret != o.Secret {
		diffs = append(diffs, "key_secret")
	}
	for _, name := range slices.Sorted(maps.Keys(f.Zones)) {
		z, there := o.Zones[name]
		switch {
		case !there:
			diffs = append(diffs, fmt.Sprintf("zone %q is global here, not there", name))
		case z.Key != f.Zones[name].Key:
			diffs = append(diffs, fmt.Sprintf("zone %q's key", name))
		}
		if there && z.Limit != f.Zones[name].Limit {
			diffs = append(diffs, fmt.Sprintf("zone %q's algorithm, rate or burst", name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(o.Zones)) {
		if _, here := f.Zones[name]; !here {
			diffs = append(diffs, fmt.Sprintf("zone %q is global there, not here", truncate(name, 64)))
		}
		if len(diffs) > 8 {
			diffs = append(diffs[:8], "more")
			break
		}
	}
	return strings.Join(diffs, "; ")
}

// truncate is s cut to n bytes (a peer's zone name, in a log line).
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
