package bucket

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Policy is a limit: its algorithm and numbers. For the token bucket,
// Burst tokens of capacity refilled at Rate per Period; for the windows,
// Rate requests per window of Period (Burst is Rate); for the leaky bucket,
// requests leave at Rate per Period and up to Burst more wait their turn;
// for the concurrency limit, Slots requests in flight at once (it has no
// rate, period or burst).
type Policy struct {
	Algorithm Algorithm
	Rate      int64
	Period    time.Duration
	Burst     int64
	// Slots is how many requests a Concurrency policy lets in flight at
	// once; the other algorithms ignore it.
	Slots int64
	// NoDelay lets a leaky bucket's burst through at once instead of
	// spacing it out (nginx's nodelay).
	NoDelay bool
	// Lease is how long a concurrency slot held in Redis outlives a Caddy
	// that crashed while holding it.
	Lease time.Duration
	// Calendar is a Quota's: the periods its Rate counts in (Period is
	// then its unit's Nominal length). Other algorithms leave it zero.
	Calendar Calendar
	// Ban, when After is set, bans a client refused After times within
	// Within, for For.
	Ban Ban
}

// Ban bans repeat offenders: a client refused After times within Within
// is refused, whatever its bucket holds, for For.
type Ban struct {
	After  int64
	Within time.Duration
	For    time.Duration
}

// Validate reports what is wrong with b, if anything.
func (b Ban) Validate() error {
	if b.After == 0 {
		return nil
	}
	if b.After < 1 || b.Within < time.Millisecond || b.For < time.Millisecond || b.Within > MaxPeriod || b.For > MaxPeriod {
		return fmt.Errorf("ban after %d within %s for %s: want at least 1 refusal, durations of at least 1ms", b.After, b.Within, b.For)
	}
	return nil
}

// units maps the unit letter of a rate ("100r/m") to its duration.
var units = map[byte]time.Duration{
	's': time.Second,
	'm': time.Minute,
	'h': time.Hour,
	'd': 24 * time.Hour,
}

// MaxRate bounds the numbers of a rate so that every computation stays
// exact in a float64 (and in Lua, whose numbers are doubles).
const MaxRate = 1 << 40

// MaxCost bounds the cost of a request, as MaxRate bounds a policy's
// numbers: it is the largest limit a valid policy has (a leaky bucket's
// Burst + 1). A cost from a placeholder may be anything up to
// math.MaxInt64; the stores count a cost above MaxCost as MaxCost + 1,
// more than any limit, so that it is refused as any cost over the limit
// is, and every sum with it stays exact, in int64 and in float64 (Lua's
// numbers; luascripts/common.lua bounds the cost the same way).
const MaxCost = MaxRate + 1

// BoundedCost is cost within [0, MaxCost + 1]: a negative cost counts as
// none (no zone gives one), one above MaxCost as MaxCost + 1.
func BoundedCost(cost int64) int64 {
	return min(max(cost, 0), MaxCost+1)
}

// ParseRate parses a rate such as "100r/m", "5r/s" or "30r/10m": N requests
// per unit, where the unit is s, m, h or d and may carry a multiplier.
// An error says how to write it (rateForms), and suggests the rate meant
// for a unit written as a word (100r/min: 100r/m), a fraction of a
// request (0.5r/s: 1r/2s or 30r/m) or a unit below a second (10r/ms:
// 10000r/s).
func ParseRate(s string) (n int64, period time.Duration, err error) {
	n, period, err = parseRate(s)
	if err != nil {
		return 0, 0, unitWordHint(s, err)
	}
	return n, period, nil
}

// parseRate is ParseRate without the hint for a unit written as a word.
func parseRate(s string) (n int64, period time.Duration, err error) {
	count, per, ok := strings.Cut(s, "r/")
	if !ok {
		return 0, 0, fmt.Errorf("rate %q: want <N>r/<s|m|h|d>, such as %s", s, rateForms)
	}
	if subSecond(per) {
		return 0, 0, fmt.Errorf("rate %q: the units are s, m, h and d%s", s, perSecondHint(count, per))
	}
	n, err = parsePositive(count)
	if err != nil {
		return 0, 0, fmt.Errorf("rate %q: requests: %w%s", s, err, fractionHint(count, per))
	}
	period, err = parsePeriod(per)
	if err != nil {
		return 0, 0, fmt.Errorf("rate %q: period: %w; write %s", s, err, rateForms)
	}
	return n, period, nil
}

// rateForms are examples of rates, for error messages.
const rateForms = "10r/s, 1r/2s or 30r/m"

// subUnits are the units below a second that a rate may be mistaken to
// take, by their length in ns.
var subUnits = map[string]int64{"ms": 1e6, "us": 1e3, "µs": 1e3, "ns": 1}

// subSecond reports whether per ends in a unit below a second.
func subSecond(per string) bool {
	for u := range subUnits {
		if strings.HasSuffix(per, u) {
			return true
		}
	}
	return false
}

// perSecondHint is the rate per second that count per per (a unit below a
// second, maybe with a multiplier) means, when it is a whole number.
func perSecondHint(count, per string) string {
	for u, ns := range subUnits {
		mult, ok := strings.CutSuffix(per, u)
		if !ok {
			continue
		}
		c, err1 := parsePositive(count)
		m, err2 := parsePositive(cmp.Or(mult, "1"))
		if err1 != nil || err2 != nil || m > int64(time.Second)/ns || c > math.MaxInt64/int64(time.Second) {
			break // no whole rate per second, or none in range
		}
		// m*ns is at most 1e9, c*1e9 within int64
		if perNs := m * ns; (c*int64(time.Second))%perNs == 0 && c*int64(time.Second)/perNs <= MaxRate {
			return fmt.Sprintf(": %sr/%s is %dr/s", count, per, c*int64(time.Second)/perNs)
		}
	}
	return ": write " + rateForms
}

// fractionHint suggests whole rates for a fraction of a request per unit
// (0.5r/s: 1r/2s or 30r/m), else says how to write a rate.
func fractionHint(count, per string) string {
	f, err := strconv.ParseFloat(count, 64)
	if err != nil || !(f > 0) || len(per) != 1 || units[per[0]] == 0 {
		return "; write " + rateForms
	}
	var hints []string
	for k := int64(1); k <= 100 && len(hints) == 0; k++ { // the fewest units: k units for a whole n
		if n := f * float64(k); math.Abs(n-math.Round(n)) < 1e-9 && n >= 1 && n <= MaxRate {
			hints = append(hints, fmt.Sprintf("%dr/%d%s", int64(math.Round(n)), k, per))
		}
	}
	if bigger, ok := nextUnit[per]; ok {
		if n := f * float64(bigger.mult); math.Abs(n-math.Round(n)) < 1e-9 && n >= 1 && n <= MaxRate {
			hints = append(hints, fmt.Sprintf("%dr/%s", int64(math.Round(n)), bigger.unit))
		}
	}
	if len(hints) == 0 {
		return "; write " + rateForms
	}
	return "; requests are whole: write " + strings.Join(hints, " or ")
}

// nextUnit is, for each unit of a rate, the next longer one, in it.
var nextUnit = map[string]struct {
	unit string
	mult int64
}{"s": {"m", 60}, "m": {"h", 60}, "h": {"d", 24}}

// parsePeriod parses "m", "s", "10m": an optional multiplier and a unit.
func parsePeriod(s string) (time.Duration, error) {
	if s == "" {
		return 0, errors.New("missing unit (s, m, h or d)")
	}
	unit, ok := units[s[len(s)-1]]
	if !ok {
		_, size := utf8.DecodeLastRuneInString(s)
		return 0, fmt.Errorf("unknown unit %q (want s, m, h or d)", s[len(s)-size:])
	}
	mult := int64(1)
	if len(s) > 1 {
		var err error
		if mult, err = parsePositive(s[:len(s)-1]); err != nil {
			return 0, err
		}
	}
	if mult > int64(365*24*time.Hour/unit) {
		return 0, errors.New("longer than a year")
	}
	return time.Duration(mult) * unit, nil
}

// parsePositive parses a decimal integer in [1, MaxRate].
func parsePositive(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	if n < 1 || n > MaxRate {
		return 0, fmt.Errorf("%d is out of range [1, %d]", n, int64(MaxRate))
	}
	return n, nil
}

// MaxPeriod bounds a policy's period and the time its bucket takes to
// refill from empty, so that times stay within int64 nanoseconds.
const MaxPeriod = 100 * 365 * 24 * time.Hour

// Limit is what X-RateLimit-Limit says: the requests that may come at
// once. For the leaky bucket, one at its rate and Burst more that wait.
func (p Policy) Limit() int64 {
	switch {
	case p.Algorithm.Windowed():
		return p.Rate
	case p.Algorithm == LeakyBucket:
		return p.Burst + 1
	case p.Algorithm == Concurrency:
		return p.Slots
	}
	return p.Burst
}

// DefaultBurst is the burst of a policy of algo at n per period that sets
// none: n, but none for the leaky bucket (nginx's default: requests are
// spaced out).
func DefaultBurst(algo Algorithm, n int64) int64 {
	if algo == LeakyBucket {
		return 0
	}
	return n
}

// Validate reports what is wrong with p, if anything.
func (p Policy) Validate() error {
	if p.Algorithm == Concurrency {
		if p.Slots < 1 || p.Slots > MaxRate || p.Lease < time.Second {
			return fmt.Errorf("concurrency: %d in flight (want at least 1), lease %s (want at least 1s)", p.Slots, p.Lease)
		}
		return nil
	}
	if (p.Algorithm == Quota) != (p.Calendar.Unit != NoCalendar) {
		return fmt.Errorf("a quota needs a calendar period, and only a quota has one")
	}
	switch {
	case p.Rate < 1 || p.Rate > MaxRate:
		return fmt.Errorf("rate %d is out of range [1, %d]", p.Rate, int64(MaxRate))
	case p.Period < time.Millisecond || p.Period > MaxPeriod:
		return fmt.Errorf("period %s is out of range [1ms, 100 years]", p.Period)
	case p.Burst < 0 || p.Burst < 1 && p.Algorithm != LeakyBucket || p.Burst > MaxRate:
		return fmt.Errorf("burst %d is out of range [1, %d]", p.Burst, int64(MaxRate))
	case float64(p.Burst)*p.Interval() > float64(MaxPeriod):
		return fmt.Errorf("burst %d takes over 100 years to refill at %s", p.Burst, p)
	}
	return nil
}

// Interval is the time one token takes to refill, in nanoseconds.
func (p Policy) Interval() float64 {
	return float64(p.Period) / float64(p.Rate)
}

// String describes the limit for people: "100 requests per minute".
func (p Policy) String() string {
	if p.Algorithm == Concurrency {
		return fmt.Sprintf("%d requests at a time", p.Slots)
	}
	noun := "requests"
	if p.Rate == 1 {
		noun = "request"
	}
	if p.Algorithm == Quota {
		return fmt.Sprintf("%d %s per %s", p.Rate, noun, p.Calendar)
	}
	return fmt.Sprintf("%d %s per %s", p.Rate, noun, periodName(p.Period))
}

func periodName(d time.Duration) string {
	names := []struct {
		unit time.Duration
		name string
	}{{24 * time.Hour, "day"}, {time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}}
	for _, u := range names {
		switch {
		case d == u.unit:
			return u.name
		case d%u.unit == 0:
			return strconv.FormatInt(int64(d/u.unit), 10) + " " + u.name + "s"
		}
	}
	return d.String()
}
