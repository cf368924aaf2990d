package bucket

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

func TestParseRate(t *testing.T) {
	good := []struct {
		in     string
		n      int64
		period time.Duration
	}{
		{"100r/m", 100, time.Minute},
		{"5r/s", 5, time.Second},
		{"1r/h", 1, time.Hour},
		{"2r/d", 2, 24 * time.Hour},
		{"30r/10m", 30, 10 * time.Minute},
	}
	for _, c := range good {
		n, p, err := ParseRate(c.in)
		if err != nil || n != c.n || p != c.period {
			t.Errorf("ParseRate(%q) = %d, %s, %v; want %d, %s", c.in, n, p, err, c.n, c.period)
		}
	}
	bad := map[string]string{
		"":                        "want <N>r/",
		"100":                     "want <N>r/",
		"100/m":                   "want <N>r/",
		"r/m":                     "not a whole number",
		"0r/m":                    "out of range",
		"-5r/m":                   "out of range",
		"1.5r/s":                  "not a whole number",
		"10r/":                    "missing unit",
		"10r/w":                   "unknown unit",
		"10r/0m":                  "out of range",
		"10r/xm":                  "not a whole number",
		"10r/400d":                "longer than a year",
		"99999999999999999999r/s": "not a whole number",
	}
	for in, want := range bad {
		if _, _, err := ParseRate(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRate(%q) error = %v; want it to mention %q", in, err, want)
		}
	}
	// Odd rates fail cleanly, and hint no rate out of range.
	for _, in := range []string{"1r/288230376151711744ms", "1r/2305843009213693952us", "1e30r/s", "1099511627776r/1ns",
		"1r/ｓ", "r/", "0.0r/s", "1e400r/s", "NaNr/s", "Infr/s", "-0.5r/s", "1r/0ms", "99999999999r/ns"} {
		_, _, err := ParseRate(in)
		if err == nil || strings.Contains(err.Error(), "-") && !strings.HasPrefix(in, "-") || !utf8.ValidString(err.Error()) {
			t.Errorf("ParseRate(%q) error = %v; want a clean error", in, err)
		}
	}
	// Each error says how to fix it.
	hints := map[string][]string{
		"0.5r/s":  {"1r/2s", "30r/m"},
		"1.5r/m":  {"3r/2m"},
		"0.25r/h": {"1r/4h", "6r/d"},
		"10r/ms":  {"10000r/s", "units are s, m, h and d"},
		"5r/us":   {"units are s, m, h and d"},
		"10/s":    {"10r/s, 1r/2s or 30r/m"},
		"10r/w":   {"10r/s, 1r/2s or 30r/m"},
	}
	for in, wants := range hints {
		_, _, err := ParseRate(in)
		for _, want := range wants {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("ParseRate(%q) error = %v; want a hint %q", in, err, want)
			}
		}
	}
}

func TestPolicyValidate(t *testing.T) {
	bad := map[Policy]string{
		{Rate: 0, Period: time.Second, Burst: 1}:            "rate 0 is out of range",
		{Rate: 1, Period: 0, Burst: 1}:                      "period 0s is out of range",
		{Rate: 1, Period: time.Second, Burst: 0}:            "burst 0 is out of range",
		{Rate: 1, Period: 365 * 24 * time.Hour, Burst: 300}: "takes over 100 years to refill",
		{Rate: 1, Period: 24 * time.Hour, Burst: 1 << 40}:   "takes over 100 years to refill",
	}
	for p, want := range bad {
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v.Validate() = %v; want it to mention %q", p, err, want)
		}
	}
	if err := (Policy{Rate: 1, Period: 365 * 24 * time.Hour, Burst: 99}).Validate(); err != nil {
		t.Errorf("99 years to refill: %v", err)
	}
}

func TestPolicyString(t *testing.T) {
	cases := map[Policy]string{
		{Rate: 100, Period: time.Minute}:           "100 requests per minute",
		{Rate: 1, Period: time.Hour}:               "1 request per hour",
		{Rate: 30, Period: 10 * time.Minute}:       "30 requests per 10 minutes",
		{Rate: 5, Period: 48 * time.Hour}:          "5 requests per 2 days",
		{Rate: 5, Period: 1500 * time.Millisecond}: "5 requests per 1.5s",
	}
	for p, want := range cases {
		if got := p.String(); got != want {
			t.Errorf("%+v.String() = %q; want %q", p, got, want)
		}
	}
}

// TestMaxCost: MaxCost is the largest limit of a valid policy, exact in a
// float64 with room to add to it, and the scripts bound costs with the
// same number.
func TestMaxCost(t *testing.T) {
	largest := Policy{Algorithm: LeakyBucket, Rate: MaxRate, Period: MaxPeriod, Burst: MaxRate, NoDelay: true}
	if err := largest.Validate(); err != nil || largest.Limit() != MaxCost {
		t.Fatalf("the largest leaky bucket: limit %d, %v; want MaxCost, %d", largest.Limit(), err, int64(MaxCost))
	}
	if float64(2*MaxCost+2) != float64(2*MaxCost+1)+1 {
		t.Fatal("MaxCost is too large to add to exactly in a float64")
	}
	if want := fmt.Sprintf("local max_cost = %d\n", int64(MaxCost)); !strings.Contains(luascripts.FixedWindow, want) {
		t.Fatalf("common.lua does not say %q", want)
	}
}

// TestParseRateUnitWords: a unit written as a word names the rate meant,
// wherever the rate comes from (a Caddyfile or the overrides API).
func TestParseRateUnitWords(t *testing.T) {
	for in, want := range map[string]string{
		"4r/min":       `unknown unit "min": write 4r/m`,
		"100r/sec":     `write 100r/s`,
		"1r/2hours":    `write 1r/2h`,
		"5r/day":       `write 5r/d`,
		"5r/fortnight": `unknown unit "fortnight" (want s, m, h or d)`,
	} {
		if _, _, err := ParseRate(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRate(%q) error = %v; want it to say %q", in, err, want)
		}
	}
}

// TestConcurrencySlots: an in-flight limit counts its own field, Slots,
// not a burst: its limit, its validation, its text and its share among
// instances; a burst set on it is ignored.
func TestConcurrencySlots(t *testing.T) {
	p := Policy{Algorithm: Concurrency, Slots: 3, Burst: 50, Lease: time.Minute}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if p.Limit() != 3 || p.String() != "3 requests at a time" {
		t.Errorf("limit %d, %q; want 3, 3 requests at a time", p.Limit(), p.String())
	}
	if local, err := InstanceShare(p, 2); err != nil || local.Slots != 1 {
		t.Errorf("a share of 3 slots among 2: %d (%v), want 1", local.Slots, err)
	}
	var b State
	for i, want := range []bool{true, true, true, false} {
		next, d := p.Take(b, i > 0, 0, 1)
		if d.Allowed != want || d.Limit != 3 {
			t.Fatalf("request %d: allowed %v limit %d; want %v, 3", i, d.Allowed, d.Limit, want)
		}
		if d.Allowed {
			b = next
		}
	}
	if err := (Policy{Algorithm: Concurrency, Burst: 3, Lease: time.Minute}).Validate(); err == nil {
		t.Error("a concurrency policy with no slots is valid")
	}
}
