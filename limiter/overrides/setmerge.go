package overrides

// Changing a snapshot: a copy with the changes made, the tombstones kept
// apart from the overrides in force (a request never looks at them).

import "maps"

// apply is a copy of s with changes made, at token: of the zones whose
// keys changed, only the maps of the digests changed are copied. A change
// to a tombstone removes the override, and the reverse.
func (s *Set) apply(changes []entryChange, token string) *Set {
	n := s.shallow(token)
	e := setEdit{s: n, own: map[editZone]bool{}, copied: map[editShard]bool{}}
	for _, c := range changes {
		e.set(false, c, !c.gone && !c.o.Deleted)
		e.set(true, c, !c.gone && c.o.Deleted)
		if !c.gone && n.newest.Compare(c.o.Stamp) < 0 {
			n.newest = c.o.Stamp
		}
	}
	for _, keys := range []map[string]*zoneKeys{n.keys, n.deadKeys} {
		for z, k := range keys {
			if k.len() == 0 {
				delete(keys, z)
			}
		}
	}
	return n
}

// shallow is a copy of s at token, whose maps of zones are its own, and
// share their keys' with s.
func (s *Set) shallow(token string) *Set {
	n := &Set{token: token, version: tokenVersion(token), zones: map[string]Override{}, keys: map[string]*zoneKeys{},
		deadZones: map[string]Override{}, deadKeys: map[string]*zoneKeys{}}
	if s != nil {
		n.skipped, n.over, n.newest = s.skipped, s.over, s.newest
		maps.Copy(n.zones, s.zones)
		maps.Copy(n.keys, s.keys) // shared until changed
		maps.Copy(n.deadZones, s.deadZones)
		maps.Copy(n.deadKeys, s.deadKeys)
	}
	return n
}

// setEdit makes changes to a Set of its own, copying the maps of keys it
// changes once.
type setEdit struct {
	s      *Set
	own    map[editZone]bool
	copied map[editShard]bool
}

type editZone struct {
	dead bool
	zone string
}

type editShard struct {
	editZone
	b byte
}

// set puts c's override among the tombstones (dead) or the overrides,
// or, when not present, removes it from them.
func (e *setEdit) set(dead bool, c entryChange, present bool) {
	zones, keys := e.s.zones, e.s.keys
	if dead {
		zones, keys = e.s.deadZones, e.s.deadKeys
	}
	if c.digest == nil {
		if present {
			zones[c.zone] = c.o
		} else {
			delete(zones, c.zone)
		}
		return
	}
	if _, ok := keys[c.zone].get(*c.digest); !ok && !present {
		return // nothing to remove
	}
	z := editZone{dead, c.zone}
	if !e.own[z] { // the zone's 256 pointers, its own
		k := new(zoneKeys)
		if old := keys[c.zone]; old != nil {
			*k = *old
		}
		keys[c.zone], e.own[z] = k, true
	}
	k, sh := keys[c.zone], editShard{z, c.digest[0]}
	if !e.copied[sh] { // the digest's map, its own
		k.shard[sh.b], e.copied[sh] = maps.Clone(k.shard[sh.b]), true
	}
	if present {
		k.put(*c.digest, c.o)
	} else {
		k.remove(*c.digest)
	}
}

// tombstones yields s's tombstones: zone, digest (nil for a zone's), the
// tombstone.
func (s *Set) tombstones(yield func(string, *[16]byte, Override) bool) {
	if s == nil {
		return
	}
	for z, o := range s.deadZones {
		if !yield(z, nil, o) {
			return
		}
	}
	for z, k := range s.deadKeys {
		for d, o := range k.all() {
			if !yield(z, &d, o) {
				return
			}
		}
	}
}

// held is the entry of zone (and digest) that s holds, override or
// tombstone.
func (s *Set) held(zone string, digest *[16]byte) (Override, bool) {
	if s == nil {
		return Override{}, false
	}
	if digest == nil {
		if o, ok := s.zones[zone]; ok {
			return o, true
		}
		o, ok := s.deadZones[zone]
		return o, ok
	}
	if o, ok := s.keys[zone].get(*digest); ok {
		return o, true
	}
	return s.deadKeys[zone].get(*digest)
}
