package overrides

// Reading the overrides from Redis, as untrusted input: anyone who can
// write Redis can write the hash or publish on the channel. Whatever they
// hold, an instance reads at most MaxEntries entries, each with a
// name of at most maxOverrideName bytes and a value of at most
// maxOverrideValue: a script (overrides_read.lua) leaves the longer ones
// in Redis and names them, so that no reply grows with what was written;
// the rest is skipped and reported once, and the instance serves with what
// it read. A whole read parses page by page; whole reads are spaced
// (wholeReadGap, wholeReadSpan in overrides.go), so that version bumps
// cannot keep an instance reading.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/jsonerr"
	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

// MaxEntries bounds the entries of the overrides an instance
// reads; past it, the rest is left out.
const MaxEntries = 100_000

// maxOverrideName and maxOverrideValue bound an entry's name and value
// (an override's are far shorter: a zone's name, a digest, a few fields,
// and who set it, at most 256 bytes); maxPushedNames the entries that the
// changes pushed name before a read (past it, a whole read).
const (
	maxOverrideName  = 1024
	maxOverrideValue = 2048
	maxPushedNames   = 10_000
)

var overridesRead = redis.NewScript(luascripts.OverridesRead)

// readPage runs the read script ("scan" from a cursor, or "get" of names):
// the next cursor, the entries that fit (name, value, ...), and the names
// (cut short) and lengths of those that do not.
func (r *redisOverrides) readPage(ctx context.Context, args ...any) (string, []string, []any, error) {
	v, err := overridesRead.Run(ctx, r.client, []string{r.hash}, append([]any{maxOverrideName, maxOverrideValue}, args...)...).Result()
	if err != nil {
		return "", nil, nil, fmt.Errorf("reading the overrides: %w", err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) != 3 {
		return "", nil, nil, fmt.Errorf("%w: overrides read reply %T", errReply, v)
	}
	cursor, _ := reply[0].(string)
	fitting, _ := reply[1].([]any)
	big, _ := reply[2].([]any)
	fit := make([]string, 0, len(fitting))
	for _, x := range fitting {
		s, _ := x.(string)
		fit = append(fit, s)
	}
	return cursor, fit, big, nil
}

// load reads the whole hash, in pages, between two readings of the
// version that must agree (else again, at most 3 times: the last reading
// stands, and the next poll corrects it).
func (r *redisOverrides) load(ctx context.Context, skipped func(string, string, error)) (*Set, error) {
	for try := 1; ; try++ {
		before, err := r.version(ctx)
		if err != nil {
			return nil, err
		}
		b, err := r.scanAll(ctx, skipped)
		if err != nil {
			return nil, err
		}
		after, err := r.version(ctx)
		if err != nil {
			return nil, err
		}
		if before == after {
			return b.done(after), nil
		}
		if try == 3 { // changing all along: labelled as no version, so the next poll reads it all again
			return b.done("?" + after), nil
		}
	}
}

// scanAll reads the pages of the hash into a set, up to MaxEntries entries.
func (r *redisOverrides) scanAll(ctx context.Context, skipped func(string, string, error)) (*setBuilder, error) {
	b := newSetBuilder(skipped)
	count := cmp.Or(r.scanCount, 1000)
	for cursor := "0"; ; {
		next, fit, big, err := r.readPage(ctx, "scan", cursor, count)
		if err != nil {
			return nil, err
		}
		b.tooBig(big)
		for i := 0; i+1 < len(fit) && b.n < MaxEntries; i += 2 {
			b.add(fit[i], fit[i+1])
		}
		if b.n >= MaxEntries {
			held, err := r.client.HLen(ctx, r.hash).Result()
			if err != nil {
				return nil, fmt.Errorf("counting the overrides: %w", err)
			}
			b.s.over = max(int(held)-b.n, 0)
			break
		}
		if next == "0" || next == "" {
			break
		}
		cursor = next
	}
	if r.afterScan != nil {
		r.afterScan()
	}
	return b, nil
}

// entries reads the entries named (at most maxPushedNames).
func (r *redisOverrides) entries(ctx context.Context, names []string, skipped func(string, string, error)) ([]entryChange, error) {
	args := make([]any, 0, len(names)+1)
	args = append(args, "get")
	for _, n := range names {
		args = append(args, n)
	}
	_, fit, big, err := r.readPage(ctx, args...)
	if err != nil {
		return nil, err
	}
	b := newSetBuilder(skipped)
	b.tooBig(big)
	values := make(map[string]string, len(fit)/2)
	for i := 0; i+1 < len(fit); i += 2 {
		values[fit[i]] = fit[i+1]
	}
	changes := make([]entryChange, 0, len(names))
	for _, name := range names {
		zone, digest, err := parseOverrideField(name)
		if err != nil {
			skipped(name, "", err)
			continue
		}
		value, ok := values[name]
		o, err := Override{}, error(nil)
		if ok {
			_, _, o, err = parseOverrideEntry(name, value)
			if err != nil {
				skipped(name, value, err)
			}
		}
		changes = append(changes, entryChange{zone: zone, digest: digest, o: o, gone: !ok || err != nil})
	}
	return changes, nil
}

// setBuilder builds a set from the entries read, leaving out, and
// reporting, those it cannot read; n counts the entries read.
type setBuilder struct {
	s       *Set
	n       int
	skipped func(entry, value string, err error)
}

func newSetBuilder(skipped func(string, string, error)) *setBuilder {
	return &setBuilder{s: (*Set)(nil).shallow(""), skipped: skipped}
}

// add reads the entry name, whose value is value.
func (b *setBuilder) add(name, value string) {
	b.n++
	zone, digest, o, err := parseOverrideEntry(name, value)
	if err != nil {
		b.s.skipped++
		b.skipped(name, value, err)
		return
	}
	if b.s.newest.Compare(o.Stamp) < 0 {
		b.s.newest = o.Stamp
	}
	zones, keys := b.s.zones, b.s.keys
	if o.Deleted {
		zones, keys = b.s.deadZones, b.s.deadKeys
	}
	if digest == nil {
		zones[zone] = o
		return
	}
	if keys[zone] == nil {
		keys[zone] = new(zoneKeys)
	}
	keys[zone].put(*digest, o)
}

// tooBig reports the entries the read script left in Redis: name (cut
// short), the name's length, the value's, ...
func (b *setBuilder) tooBig(big []any) {
	for i := 0; i+2 < len(big); i += 3 {
		name, _ := big[i].(string)
		nameLen, _ := big[i+1].(int64)
		valueLen, _ := big[i+2].(int64)
		b.n++
		b.s.skipped++
		b.skipped(name, fmt.Sprint(nameLen, valueLen), fmt.Errorf("entry of a %d-byte name and a %d-byte value: an override's are at most %d and %d bytes",
			nameLen, valueLen, maxOverrideName, maxOverrideValue))
	}
}

// done is the set built, at token.
func (b *setBuilder) done(token string) *Set {
	b.s.token, b.s.version = token, tokenVersion(token)
	return b.s
}

// parseOverrideEntry reads an entry. Fields it does not know are ignored
// (a newer version's, during a rolling upgrade): what it knows applies.
func parseOverrideEntry(name, value string) (string, *[16]byte, Override, error) {
	var o Override
	zone, digest, err := parseOverrideField(name)
	if err != nil {
		return "", nil, o, err
	}
	if len(name) > maxOverrideName || len(value) > maxOverrideValue {
		return "", nil, o, fmt.Errorf("entry of a %d-byte name and a %d-byte value: an override's are at most %d and %d bytes",
			len(name), len(value), maxOverrideName, maxOverrideValue)
	}
	dec := json.NewDecoder(strings.NewReader(value))
	if err := dec.Decode(&o); err != nil {
		return "", nil, o, fmt.Errorf("value: %s", jsonerr.Describe(err))
	}
	if dec.More() {
		return "", nil, o, errors.New("value: data after the JSON object")
	}
	if err := o.Check(digest != nil); err != nil {
		return "", nil, o, fmt.Errorf("value: %w", err)
	}
	return zone, digest, o, nil
}

// maxVersionToken bounds a version token ("<n>:<16 hex digits>"), and
// maxDeltaPayload a change's message: two versions and 1,001 names of the
// longest.
const (
	maxVersionToken = 64
	maxDeltaPayload = 2*(maxVersionToken+1) + 1001*(maxOverrideName+1)
)

// parseDelta reads a change's message: "<prev> <next> <names...>"; false
// for one this version does not read (a whole read is then due).
func parseDelta(payload string) (delta, bool) {
	if len(payload) > maxDeltaPayload {
		return delta{}, false
	}
	f := strings.Fields(payload)
	if len(f) < 3 || len(f) > 2+1001 {
		return delta{}, false
	}
	if len(f[0]) > maxVersionToken || len(f[1]) > maxVersionToken {
		return delta{}, false
	}
	names := make([]string, 0, len(f)-2)
	for _, name := range f[2:] {
		if len(name) > maxOverrideName {
			return delta{}, false
		}
		names = append(names, strings.Clone(name)) // not the whole payload kept
	}
	prev := strings.Clone(f[0])
	if prev == "-" {
		prev = ""
	}
	return delta{prev: prev, next: strings.Clone(f[1]), names: names}, true
}

// errReply is a script's reply of an unexpected shape.
var errReply = errors.New("unexpected reply from an overrides script")
