package overrides

// What a snapshot of the overrides says of itself: its version, its size,
// the overrides that expired.

import (
	"encoding/hex"
	"time"
)

// token is s's version token; "" for the nil set.
func (s *Set) tokenOf() string {
	if s == nil {
		return ""
	}
	return s.token
}

// Version is the version of the overrides s was read at: a number that
// every change moves on.
func (s *Set) Version() int64 {
	if s == nil {
		return 0
	}
	return s.version
}

// prune is s without the overrides and tombstones expired at now (s
// itself when none has).
func (s *Set) prune(now time.Time) *Set {
	if len(s.expired(now)) == 0 && !s.deadExpired(now) {
		return s
	}
	n := &Set{token: s.token, version: s.version, skipped: s.skipped, over: s.over, newest: s.newest,
		zones: map[string]Override{}, keys: map[string]*zoneKeys{}, deadZones: map[string]Override{}, deadKeys: map[string]*zoneKeys{}}
	keepActive(now, s.zones, s.keys, n.zones, n.keys)
	keepActive(now, s.deadZones, s.deadKeys, n.deadZones, n.deadKeys)
	return n
}

// keepActive copies the entries of zones and keys active at now to
// toZones and toKeys.
func keepActive(now time.Time, zones map[string]Override, keys map[string]*zoneKeys, toZones map[string]Override, toKeys map[string]*zoneKeys) {
	for z, o := range zones {
		if o.Active(now) {
			toZones[z] = o
		}
	}
	for z, m := range keys {
		k := new(zoneKeys)
		for d, o := range m.all() {
			if o.Active(now) {
				k.put(d, o)
			}
		}
		if k.len() > 0 {
			toKeys[z] = k
		}
	}
}

// deadExpired reports whether a tombstone of s expired at now.
func (s *Set) deadExpired(now time.Time) bool {
	found := false
	s.tombstones(func(_ string, _ *[16]byte, o Override) bool {
		found = !o.Active(now)
		return !found
	})
	return found
}

// expired lists s's overrides that are no longer in force at now.
func (s *Set) expired(now time.Time) []Entry {
	var gone []Entry
	if s == nil {
		return nil
	}
	for z, o := range s.zones {
		if !o.Active(now) {
			gone = append(gone, Entry{Zone: z, Override: o})
		}
	}
	for z, m := range s.keys {
		for d, o := range m.all() {
			if !o.Active(now) {
				gone = append(gone, Entry{Zone: z, Digest: hex.EncodeToString(d[:]), Override: o})
			}
		}
	}
	return gone
}

// size is how many entries s holds, overrides and tombstones, expired or
// not.
func (s *Set) size() int {
	if s == nil {
		return 0
	}
	n := len(s.zones) + len(s.deadZones)
	for _, k := range s.keys {
		n += k.len()
	}
	for _, k := range s.deadKeys {
		n += k.len()
	}
	return n
}

// leftOut is how many entries were left out of s past MaxEntries.
func (s *Set) leftOut() int {
	if s == nil {
		return 0
	}
	return s.over
}
