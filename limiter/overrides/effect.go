package overrides

// What the overrides in force do to one request of a zone: the one place
// that says it, for the requests and for the admin API's views of them.
//
// The zone's override applies first: its limits (rate, burst or
// max_concurrent) replace the config's, its dry_run the config's dry run,
// and disabled turns the zone off. The key's override applies next: an
// exempt key passes uncounted (nothing else is looked at), a blocked one is
// refused for as long as the block lasts (at most MaxBlock), and its limits
// replace those that the zone's override left. An override's limits that
// the zone's algorithm does not take (an override set for an earlier
// config, or for another instance's zone of that name) are left out, and
// so are limits that give a policy the zone refuses: the policy under both
// overrides falls back to the one under the zone's alone, then to the
// config's. Effect says why in LeftOut; logging it is the caller's.
//
// The clock is read once, and only when an override with an expiry needs
// it (Clock): a request among no overrides reads no clock.

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// MaxBlock is how long a block without an expiry refuses at a time (the
// Retry-After it gives), and the most that any block's does.
const MaxBlock = 24 * time.Hour

// Clock is the time the overrides are in force at, read from Now once,
// when an override with an expiry first needs it. One Clock serves the
// zones of one request; a zero Clock reads time.Now.
type Clock struct {
	Now func() time.Time
	at  time.Time
}

// Time is c's time, read on the first call.
func (c *Clock) Time() time.Time {
	if c.at.IsZero() {
		c.read()
	}
	return c.at
}

// read sets c's time from Now (time.Now when Now is unset).
func (c *Clock) read() {
	if c.Now == nil {
		c.at = time.Now()
		return
	}
	c.at = c.Now()
}

// active reports whether o is in force at c's time, read only when o
// expires.
func (c *Clock) active(o *Override) bool {
	return o.Expires == 0 || c.before(o.Expires)
}

// before reports whether c's time is before ms, in Unix milliseconds.
func (c *Clock) before(ms int64) bool {
	return c.Time().UnixMilli() < ms
}

// Target is a zone as its overrides see it, for one request.
type Target struct {
	// Zone is the zone's name, which its overrides are kept under.
	Zone string
	// Policy is the config's policy for the request.
	Policy bucket.Policy
	// BurstSet: the config writes a burst, which a rate override keeps
	// (else the burst is the new rate's default).
	BurstSet bool
	// Check is what a policy under an override must pass to apply in the
	// zone besides Policy.Validate (the algorithm's bounds, the sync's);
	// nil: nothing more.
	Check func(bucket.Policy) error
}

// Effect is what the overrides in force do to one request of a zone.
type Effect struct {
	// Disabled: the zone's override turns the zone off; it counts
	// nothing.
	Disabled bool
	// Exempt: the key's override lets it through uncounted; Policy and
	// Block are then the config's (none).
	Exempt bool
	// Block, when positive, refuses the key for that long.
	Block time.Duration
	// DryRun, when set, is the zone's dry run under its override.
	DryRun *bool
	// Policy is the policy in force.
	Policy bucket.Policy
	// Zone and Key are the overrides in force, the zone's and the key's,
	// when HasZone and HasKey say there are.
	Zone, Key       Override
	HasZone, HasKey bool
	// LeftOut is why an override's limits were left out, the first
	// reason met; nil when none was.
	LeftOut error
}

// Disabled reports whether the zone's override in force at c turns zone
// off (Effect.Disabled, for a caller that has not built the request yet).
func (s *Set) Disabled(zone string, c *Clock) bool {
	o, ok := s.Zone(zone)
	return ok && o.Disabled && c.active(&o)
}

// Effect is what the overrides of s in force at c do to a request of t
// whose key has the digest key; with a nil key, what the zone's override
// alone does (the zone as the admin API lists it). See the top of this
// file.
func (s *Set) Effect(t Target, key *[16]byte, c *Clock) (e Effect) {
	e.Policy = t.Policy
	if s == nil {
		return e
	}
	p := t.Policy
	if o, ok := s.Zone(t.Zone); ok && c.active(&o) {
		e.Zone, e.HasZone, e.Disabled, e.DryRun = o, true, o.Disabled, o.DryRun
		e.limit(&p, &e.Zone, t.BurstSet)
	}
	zoned := p
	if o, ok := s.keyOf(t.Zone, key); ok && c.active(&o) {
		e.Key, e.HasKey = o, true
		if o.Exempt {
			e.Exempt = true
			return e
		}
		if o.Block {
			e.Block = o.blockFor(c)
		}
		e.limit(&p, &e.Key, t.BurstSet)
	}
	if e.HasZone || e.HasKey {
		e.settle(&t, &p, &zoned)
	}
	return e
}

// keyOf is the override of the key whose digest is key in zone; none for
// a nil key.
func (s *Set) keyOf(zone string, key *[16]byte) (Override, bool) {
	if key == nil || len(s.keys) == 0 {
		return Override{}, false
	}
	return s.keys[zone].get(*key)
}

// blockFor is how long o, a block, refuses from c's time: until it
// expires, at most MaxBlock.
func (o *Override) blockFor(c *Clock) time.Duration {
	if at := o.ExpiresAt(); !at.IsZero() {
		return min(at.Sub(c.Time()), MaxBlock)
	}
	return MaxBlock
}

// limit gives p o's limits when p's algorithm takes them; else it
// records why not.
func (e *Effect) limit(p *bucket.Policy, o *Override, burstSet bool) {
	if err := o.Fits(p.Algorithm); err != nil {
		e.leftOut(err)
		return
	}
	o.apply(p, burstSet)
}

// settle puts in force the first of p (under both overrides) and zoned
// (under the zone's alone) that is t's policy or that t takes; else t's
// policy stays. It records why a policy is not taken.
func (e *Effect) settle(t *Target, p, zoned *bucket.Policy) {
	for _, q := range [...]*bucket.Policy{p, zoned} {
		if *q == t.Policy {
			return
		}
		err := q.Validate()
		if err == nil && t.Check != nil {
			err = t.Check(*q)
		}
		if err == nil {
			e.Policy = *q
			return
		}
		e.leftOut(err)
	}
}

// leftOut records err, unless a reason came first.
func (e *Effect) leftOut(err error) {
	if e.LeftOut == nil {
		e.LeftOut = err
	}
}

// Fits reports whether a zone of algo takes o's limits.
func (o *Override) Fits(algo bucket.Algorithm) error {
	switch {
	case algo == bucket.Concurrency && (o.Rate != "" || o.Burst != 0):
		return errors.New("a max_concurrent zone takes max_concurrent, not rate or burst")
	case algo != bucket.Concurrency && o.MaxConcurrent != 0:
		return fmt.Errorf("max_concurrent applies to max_concurrent zones; this one is %s (give rate or burst)", algo)
	case algo == bucket.Quota && (o.Rate != "" || o.Burst != 0):
		return errors.New("a quota zone takes quota, not rate or burst")
	case algo != bucket.Quota && o.Quota != 0:
		return fmt.Errorf("quota applies to quota zones; this one is %s (give rate or burst)", algo)
	case algo.Windowed() && o.Burst != 0:
		return fmt.Errorf("burst does not apply to %s: its limit is N of the rate per window", algo)
	}
	return nil
}

// Apply is p with o's rate, burst or max_concurrent. A rate replaced
// brings the burst the zone's config gives it: the burst the config writes
// (burstSet: a number, or a placeholder's value, already in p), else the
// new rate's default (bucket.DefaultBurst), and the rate for the windows;
// unless o sets the burst too.
func (o *Override) Apply(p bucket.Policy, burstSet bool) bucket.Policy {
	o.apply(&p, burstSet)
	return p
}

// apply gives p o's rate, burst or max_concurrent, as Apply.
func (o *Override) apply(p *bucket.Policy, burstSet bool) {
	if n, period := o.RatePeriod(); n > 0 {
		p.Rate, p.Period = n, period
		if !burstSet || p.Algorithm.Windowed() {
			p.Burst = bucket.DefaultBurst(p.Algorithm, n)
		}
	}
	if o.Burst > 0 {
		p.Burst = o.Burst
	}
	if o.MaxConcurrent > 0 {
		p.Slots = o.MaxConcurrent
	}
	if o.Quota > 0 {
		p.Rate, p.Burst = o.Quota, o.Quota
	}
}
