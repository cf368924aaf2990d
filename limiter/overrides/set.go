package overrides

// Overrides change limits at run time, without a config change. An
// override is of a zone (its rate and burst, its dry run, the whole zone
// disabled) or of one client key in a zone (a limit of its own, a block,
// an exemption), each in force until an optional expiry. A Set is
// one immutable snapshot of them; Overrides (overrides.go) holds the
// snapshot in force and keeps it current from where the overrides live:
// this process's memory, or a Redis that a fleet shares.
//
// What an override does to a request is effect.go's to say; this file
// keeps them, checks their shape, and looks them up at the cost of a map
// read.

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Override is one override, as the admin API takes it and as it is kept
// (in Redis, its JSON). Absent fields keep the config's value.
type Override struct {
	// Rate replaces the zone's rate (or a window's limit and window):
	// "10r/m". Parsed by Check.
	Rate string `json:"rate,omitempty"`
	// Burst replaces the burst of a token or leaky bucket.
	Burst int64 `json:"burst,omitempty"`
	// MaxConcurrent replaces a concurrency limit.
	MaxConcurrent int64 `json:"max_concurrent,omitempty"`
	// Quota replaces a quota's count per period.
	Quota int64 `json:"quota,omitempty"`
	// DryRun, when set, turns the zone's dry run on or off.
	DryRun *bool `json:"dry_run,omitempty"`
	// Disabled turns a zone off: its requests are not counted.
	Disabled bool `json:"disabled,omitempty"`
	// Block refuses a client key, whatever its bucket holds.
	Block bool `json:"block,omitempty"`
	// Exempt lets a client key through a zone uncounted.
	Exempt bool `json:"exempt,omitempty"`
	// Expires is when the override ends, in Unix milliseconds; 0: when
	// it is deleted.
	Expires int64 `json:"expires,omitempty"`
	// Set is when it was set (Unix milliseconds), By who set it.
	Set int64  `json:"set,omitempty"`
	By  string `json:"by,omitempty"`
	// Stamp orders this change among the changes of the same entry
	// (Put and Delete set it): the latest wins everywhere.
	Stamp Stamp `json:"stamp,omitzero"`
	// Deleted makes this entry a tombstone: the override's deletion,
	// never in force, kept until Expires so that no older copy of the
	// override brings it back.
	Deleted bool `json:"deleted,omitempty"`

	rate   int64 // Rate, parsed by Check
	period time.Duration
}

// RatePeriod is the parsed Rate: n requests per period; 0 when none.
func (o *Override) RatePeriod() (n int64, period time.Duration) { return o.rate, o.period }

// Active reports whether o is in force at now.
func (o *Override) Active(now time.Time) bool {
	return o.Expires == 0 || now.UnixMilli() < o.Expires
}

// ExpiresAt is when o ends; the zero time when it does not.
func (o *Override) ExpiresAt() time.Time {
	if o.Expires == 0 {
		return time.Time{}
	}
	return time.UnixMilli(o.Expires)
}

// maxOverrideMillis bounds an override's times: the year 2200, so that
// every duration to it from now fits a time.Duration.
const maxOverrideMillis = 7258118400000

// maxOverrideBy bounds who set an override, as stored.
const maxOverrideBy = 256

// Check parses o's rate and reports what is wrong with its shape: the
// fields of a key's override (key) or of a zone's, their values. Whether
// they apply to the zone's algorithm is the caller's to check.
func (o *Override) Check(key bool) error {
	if o.Rate != "" {
		n, period, err := bucket.ParseRate(o.Rate)
		if err != nil {
			return fmt.Errorf("rate: %w", err)
		}
		o.rate, o.period = n, period
	}
	limits := o.Rate != "" || o.Burst != 0 || o.MaxConcurrent != 0 || o.Quota != 0
	if err := o.Stamp.check(); err != nil {
		return err
	}
	switch {
	case o.Burst < 0 || o.Burst > bucket.MaxRate:
		return fmt.Errorf("burst %d: want a whole number from 1 to %d", o.Burst, int64(bucket.MaxRate))
	case o.MaxConcurrent < 0 || o.MaxConcurrent > bucket.MaxRate:
		return fmt.Errorf("max_concurrent %d: want a whole number from 1 to %d", o.MaxConcurrent, int64(bucket.MaxRate))
	case o.Quota < 0 || o.Quota > bucket.MaxRate:
		return fmt.Errorf("quota %d: want a whole number from 1 to %d", o.Quota, int64(bucket.MaxRate))
	case o.Expires < 0 || o.Set < 0 || o.Expires > maxOverrideMillis || o.Set > maxOverrideMillis:
		return errors.New("expires and set: want Unix milliseconds before the year 2200")
	case len(o.By) > maxOverrideBy:
		return fmt.Errorf("by: at most %d bytes", maxOverrideBy)
	case key && (o.Disabled || o.DryRun != nil):
		return errors.New("disabled and dry_run apply to a zone's override, not a key's (exempt lets a key through uncounted)")
	case !key && (o.Block || o.Exempt):
		return errors.New("block and exempt apply to a key's override: give the key")
	case o.Block && o.Exempt:
		return errors.New("block and exempt: choose one")
	case (o.Block || o.Exempt) && limits:
		return errors.New("block and exempt take no rate, burst, max_concurrent or quota")
	case o.Disabled && (limits || o.DryRun != nil):
		return errors.New("disabled takes no rate, burst, max_concurrent, quota or dry_run: the zone counts nothing")
	case o.Deleted && (limits || o.Block || o.Exempt || o.Disabled || o.DryRun != nil || o.Expires == 0):
		return errors.New("deleted: a tombstone takes an expiry and no override")
	case !o.Deleted && !limits && !o.Block && !o.Exempt && !o.Disabled && o.DryRun == nil:
		return errors.New("nothing to override: give rate, burst, max_concurrent, quota, dry_run, disabled, block or exempt")
	}
	return nil
}

// Kind is what o does, in a word, for logs and listings.
func (o *Override) Kind() string {
	switch {
	case o.Disabled:
		return "disabled"
	case o.Block:
		return "block"
	case o.Exempt:
		return "exempt"
	case o.Rate == "" && o.Burst == 0 && o.MaxConcurrent == 0 && o.Quota == 0:
		return "dry_run"
	}
	return "limit"
}

// Set is one snapshot of the overrides: never changed once made.
// The nil *Set holds none.
type Set struct {
	// token names the state of the overrides it was read at: "<n>:<a
	// nonce of the change>" (a version number alone could come back with
	// other contents after a Redis lost a write); version is its n.
	token   string
	version int64
	zones   map[string]Override
	keys    map[string]*zoneKeys // by zone
	skipped int                  // entries not read (malformed)
	over    int                  // entries left out past MaxEntries
	// The tombstones (Override.Deleted), never in force: of zones, and of
	// keys by zone.
	deadZones map[string]Override
	deadKeys  map[string]*zoneKeys
	newest    Stamp // the latest stamp of the entries, tombstones included
}

// zoneKeys are the key overrides of a zone, in 256 maps by their digest's
// first byte: a change copies the 256 pointers and one map, not every
// override of the zone (100,000 of them: 14 ms a change, against 0.1).
// Never changed once in a snapshot.
type zoneKeys struct {
	n     int
	shard [256]map[[16]byte]Override
}

// get is the override of digest.
func (k *zoneKeys) get(d [16]byte) (Override, bool) {
	if k == nil {
		return Override{}, false
	}
	o, ok := k.shard[d[0]][d]
	return o, ok
}

// len is how many overrides k holds.
func (k *zoneKeys) len() int {
	if k == nil {
		return 0
	}
	return k.n
}

// all yields k's overrides.
func (k *zoneKeys) all() iter.Seq2[[16]byte, Override] {
	return func(yield func([16]byte, Override) bool) {
		if k == nil {
			return
		}
		for _, m := range k.shard {
			for d, o := range m {
				if !yield(d, o) {
					return
				}
			}
		}
	}
}

// put sets d's override in k, which the caller owns (a copy it made, or
// one being built).
func (k *zoneKeys) put(d [16]byte, o Override) {
	if k.shard[d[0]] == nil {
		k.shard[d[0]] = map[[16]byte]Override{}
	}
	if _, ok := k.shard[d[0]][d]; !ok {
		k.n++
	}
	k.shard[d[0]][d] = o
}

// remove deletes d's override from k, which the caller owns.
func (k *zoneKeys) remove(d [16]byte) {
	if _, ok := k.shard[d[0]][d]; ok {
		delete(k.shard[d[0]], d)
		k.n--
	}
}

// Zone is the override of zone, whether in force or not.
func (s *Set) Zone(zone string) (Override, bool) {
	if s == nil || len(s.zones) == 0 {
		return Override{}, false
	}
	o, ok := s.zones[zone]
	return o, ok
}

// HasKeys reports whether some key of zone has an override.
func (s *Set) HasKeys(zone string) bool {
	return s != nil && s.keys[zone].len() > 0
}

// Key is the override of the key whose digest is digest in zone.
func (s *Set) Key(zone string, digest [16]byte) (Override, bool) {
	if s == nil {
		return Override{}, false
	}
	return s.keys[zone].get(digest)
}

// Count is how many overrides of zones and of keys are in force at now.
func (s *Set) Count(now time.Time) (zones, keys int) {
	if s == nil {
		return 0, 0
	}
	for _, o := range s.zones {
		zones += btoi(o.Active(now))
	}
	for _, m := range s.keys {
		for _, o := range m.all() {
			keys += btoi(o.Active(now))
		}
	}
	return zones, keys
}

// Skipped is how many entries could not be read into s.
func (s *Set) Skipped() int {
	if s == nil {
		return 0
	}
	return s.skipped
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// NextExpiry is the earliest expiry after now among s's overrides; the
// zero time when none expires.
func (s *Set) NextExpiry(now time.Time) time.Time {
	next := int64(0)
	visit := func(o Override) {
		if o.Expires != 0 && o.Active(now) && (next == 0 || o.Expires < next) {
			next = o.Expires
		}
	}
	if s != nil {
		for _, o := range s.zones {
			visit(o)
		}
		for _, m := range s.keys {
			for _, o := range m.all() {
				visit(o)
			}
		}
	}
	if next == 0 {
		return time.Time{}
	}
	return time.UnixMilli(next)
}

// Entry is one override of a listing: of Zone, and of the key
// whose digest is Digest (hex; "" for the zone's own).
type Entry struct {
	Zone   string `json:"zone"`
	Digest string `json:"key_digest,omitempty"`
	Override
}

// Entries lists the overrides in force at now, by zone, the zone's own
// first, then by digest.
func (s *Set) Entries(now time.Time) []Entry {
	var list []Entry
	if s == nil {
		return list
	}
	for zone, o := range s.zones {
		if o.Active(now) {
			list = append(list, Entry{Zone: zone, Override: o})
		}
	}
	for zone, m := range s.keys {
		for d, o := range m.all() {
			if o.Active(now) {
				list = append(list, Entry{Zone: zone, Digest: hex.EncodeToString(d[:]), Override: o})
			}
		}
	}
	slices.SortFunc(list, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Zone, b.Zone), cmp.Compare(a.Digest, b.Digest))
	})
	return list
}

// entryChange is one entry of the overrides changed: its new value, or,
// gone, its removal.
type entryChange struct {
	zone   string
	digest *[16]byte
	o      Override
	gone   bool
}

// tokenVersion is the number that starts a version token ("<n>:<nonce>").
func tokenVersion(token string) int64 {
	n := int64(0)
	for i := 0; i < len(token) && '0' <= token[i] && token[i] <= '9' && n < 1<<50; i++ {
		n = n*10 + int64(token[i]-'0')
	}
	return n
}

// overrideField is the name of an override's entry where it is stored:
// "zone:<zone>", or "key:<digest in hex>:<zone>" for a key's.
func overrideField(zone string, digest *[16]byte) string {
	if digest == nil {
		return "zone:" + zone
	}
	return "key:" + hex.EncodeToString(digest[:]) + ":" + zone
}

// parseOverrideField is the zone and digest an entry's name gives.
func parseOverrideField(field string) (zone string, digest *[16]byte, err error) {
	if zone, ok := strings.CutPrefix(field, "zone:"); ok && zone != "" {
		return zone, nil, nil
	}
	rest, ok := strings.CutPrefix(field, "key:")
	hexDigest, zone, cut := strings.Cut(rest, ":")
	var d [16]byte
	if !ok || !cut || zone == "" || len(hexDigest) != 32 {
		return "", nil, fmt.Errorf("entry %.80q: not an override's name", field)
	}
	if _, err := hex.Decode(d[:], []byte(hexDigest)); err != nil {
		return "", nil, fmt.Errorf("entry %.80q: not an override's name", field)
	}
	return zone, &d, nil
}

// ParseDigest reads a key digest as Entries writes it (32 hex digits).
func ParseDigest(s string) ([16]byte, error) {
	var d [16]byte
	if len(s) != 32 { // the value is not quoted: it may be a key given by mistake
		return d, fmt.Errorf("key_digest: want 32 hex digits")
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return d, fmt.Errorf("key_digest: want 32 hex digits")
	}
	return d, nil
}
