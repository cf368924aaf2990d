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

// prune is s without the overrides expired at now (s itself when none
// has).
func (s *Set) prune(now time.Time) *Set {
	if len(s.expired(now)) == 0 {
		return s
	}
	n := &Set{token: s.token, version: s.version, skipped: s.skipped, over: s.over, zones: map[string]Override{}, keys: map[string]*zoneKeys{}}
	for z, o := range s.zones {
		if o.Active(now) {
			n.zones[z] = o
		}
	}
	for z, m := range s.keys {
		k := new(zoneKeys)
		for d, o := range m.all() {
			if o.Active(now) {
				k.put(d, o)
			}
		}
		if k.len() > 0 {
			n.keys[z] = k
		}
	}
	return n
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

// size is how many overrides s holds, expired or not.
func (s *Set) size() int {
	if s == nil {
		return 0
	}
	n := len(s.zones)
	for _, k := range s.keys {
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
