package bucket

import (
	"testing"
	"time"
)

func mustLoc(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestCalendarBounds: periods start at local midnight, on Monday, on the
// 1st and on 1 January, and days are 23 or 25 hours when daylight saving
// time begins or ends.
func TestCalendarBounds(t *testing.T) {
	akl, ny := mustLoc(t, "Pacific/Auckland"), mustLoc(t, "America/New_York")
	cases := []struct {
		cal        Calendar
		now        time.Time
		start, end time.Time
	}{
		{Calendar{Day, nil}, time.Date(2025, 3, 9, 12, 0, 0, 0, time.UTC),
			time.Date(2025, 3, 9, 0, 0, 0, 0, time.UTC), time.Date(2025, 3, 10, 0, 0, 0, 0, time.UTC)},
		// New York springs forward on 9 March 2025: a day of 23 hours
		{Calendar{Day, ny}, time.Date(2025, 3, 9, 12, 0, 0, 0, ny),
			time.Date(2025, 3, 9, 5, 0, 0, 0, time.UTC), time.Date(2025, 3, 10, 4, 0, 0, 0, time.UTC)},
		// and falls back on 2 November 2025: 25 hours
		{Calendar{Day, ny}, time.Date(2025, 11, 2, 1, 30, 0, 0, ny),
			time.Date(2025, 11, 2, 4, 0, 0, 0, time.UTC), time.Date(2025, 11, 3, 5, 0, 0, 0, time.UTC)},
		// Auckland falls back on 6 April 2025 (NZDT +13 to NZST +12)
		{Calendar{Day, akl}, time.Date(2025, 4, 6, 20, 0, 0, 0, akl),
			time.Date(2025, 4, 5, 11, 0, 0, 0, time.UTC), time.Date(2025, 4, 6, 12, 0, 0, 0, time.UTC)},
		{Calendar{Week, nil}, time.Date(2025, 1, 5, 23, 59, 0, 0, time.UTC), // a Sunday
			time.Date(2024, 12, 30, 0, 0, 0, 0, time.UTC), time.Date(2025, 1, 6, 0, 0, 0, 0, time.UTC)},
		{Calendar{Week, nil}, time.Date(2025, 1, 6, 0, 0, 0, 0, time.UTC), // a Monday
			time.Date(2025, 1, 6, 0, 0, 0, 0, time.UTC), time.Date(2025, 1, 13, 0, 0, 0, 0, time.UTC)},
		{Calendar{Month, ny}, time.Date(2025, 2, 14, 0, 0, 0, 0, ny),
			time.Date(2025, 2, 1, 0, 0, 0, 0, ny), time.Date(2025, 3, 1, 0, 0, 0, 0, ny)},
		{Calendar{Month, nil}, time.Date(2024, 12, 31, 23, 59, 59, 0, time.UTC),
			time.Date(2024, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Calendar{Year, akl}, time.Date(2024, 12, 31, 11, 0, 0, 0, time.UTC), // 1 January, 00:00 in Auckland
			time.Date(2024, 12, 31, 11, 0, 0, 0, time.UTC), time.Date(2025, 12, 31, 11, 0, 0, 0, time.UTC)},
	}
	for _, c := range cases {
		start, end := c.cal.Bounds(c.now)
		if !start.Equal(c.start) || !end.Equal(c.end) {
			t.Errorf("%s at %s: [%s, %s), want [%s, %s)", c.cal, c.now, start.UTC(), end.UTC(), c.start.UTC(), c.end.UTC())
		}
	}
}

// TestCalendarPartitions: in zones whose offsets change at midnight too,
// every instant of two years is in exactly one period, and each period
// ends where the next starts.
func TestCalendarPartitions(t *testing.T) {
	for _, name := range []string{"UTC", "Pacific/Auckland", "America/Santiago", "America/Havana", "Asia/Tehran", "Australia/Lord_Howe"} {
		for _, u := range []CalendarUnit{Day, Week, Month} {
			c := Calendar{u, mustLoc(t, name)}
			now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
			_, end := c.Bounds(now)
			for range 800 {
				start, next := c.Bounds(end)
				if !start.Equal(end) || !next.After(start) {
					t.Fatalf("%s: after a period ending %s comes [%s, %s)", c, end, start, next)
				}
				if s, e := c.Bounds(next.Add(-time.Nanosecond)); !s.Equal(start) || !e.Equal(next) {
					t.Fatalf("%s: the last instant of [%s, %s) is in [%s, %s)", c, start, next, s, e)
				}
				if u == Day && (next.Sub(start) < 22*time.Hour || next.Sub(start) > 26*time.Hour) {
					t.Fatalf("%s: a day of %s from %s", c, next.Sub(start), start)
				}
				end = next
			}
		}
	}
}

// TestQuotaTake: a quota counts to its limit, refuses until the period's
// end, and starts afresh at the next period's start; a refund gives back
// while the take's period lasts.
func TestQuotaTake(t *testing.T) {
	akl := mustLoc(t, "Pacific/Auckland")
	p := Policy{Algorithm: Quota, Rate: 3, Period: Day.Nominal(), Burst: 3, Calendar: Calendar{Day, akl}}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	midnight := time.Date(2025, 6, 2, 0, 0, 0, 0, akl).UnixNano()
	now := midnight - int64(time.Hour)
	var b State
	for i := range 3 {
		var d Decision
		b, d = p.Take(b, i > 0, now, 1)
		if !d.Allowed || d.Remaining != int64(2-i) || d.Reset.UnixNano() != midnight {
			t.Fatalf("take %d: %+v", i, d)
		}
	}
	_, d := p.Take(b, true, now, 1)
	if d.Allowed || d.RetryAfter != time.Hour {
		t.Fatalf("4th: %+v, want refused for an hour", d)
	}
	r, rd := p.Refund(b, true, now+1, now, midnight, 1)
	if rd.Remaining != 1 {
		t.Fatalf("refund: %+v", rd)
	}
	if _, rd = p.Refund(b, true, midnight, now, midnight, 1); rd.Remaining != 3 { // a new day: nothing to give back
		t.Fatalf("refund in the next day: %+v", rd)
	}
	b, d = p.Take(r, true, midnight, 1)
	if !d.Allowed || d.Remaining != 2 {
		t.Fatalf("at midnight: %+v", d)
	}
	if p.String() != "3 requests per day in Pacific/Auckland" {
		t.Errorf("String: %q", p.String())
	}
}

// TestCalendarMidnightGap: where a day's midnight does not exist (the
// clocks jump from 00:00 to 01:00), the day starts at its first instant,
// the jump, never at 23:00 of the day before (which would hand the last
// hour of one day to the next). West of UTC as east of it, every day of
// 2000–2030 in zones whose offset changed at midnight starts at the
// first instant of its local date.
func TestCalendarMidnightGap(t *testing.T) {
	cases := []struct {
		zone  string
		day   [3]int
		start time.Time
	}{
		{"America/Sao_Paulo", [3]int{2018, 11, 4}, time.Date(2018, 11, 4, 3, 0, 0, 0, time.UTC)}, // -03 → -02
		{"America/Havana", [3]int{2024, 3, 10}, time.Date(2024, 3, 10, 5, 0, 0, 0, time.UTC)},    // -05 → -04
		{"America/Asuncion", [3]int{2023, 10, 1}, time.Date(2023, 10, 1, 4, 0, 0, 0, time.UTC)},  // -04 → -03
	}
	for _, c := range cases {
		loc := mustLoc(t, c.zone)
		cal := Calendar{Day, loc}
		// an hour before the jump: still the day before, on the local clock
		before := c.start.Add(-time.Hour)
		if _, end := cal.Bounds(before); !end.Equal(c.start) {
			t.Errorf("%s at %s (local %s): the day ends %s, want %s", c.zone, before, before.In(loc), end.UTC(), c.start)
		}
		if start, _ := cal.Bounds(c.start.Add(time.Minute)); !start.Equal(c.start) {
			t.Errorf("%s on %v: the day starts %s, want %s", c.zone, c.day, start.UTC(), c.start)
		}
	}
	for _, zone := range []string{"America/Sao_Paulo", "America/Havana", "America/Asuncion", "America/Santiago",
		"Asia/Tehran", "Asia/Damascus", "Asia/Amman", "Africa/Cairo", "Asia/Beirut", "America/Godthab"} {
		loc := mustLoc(t, zone)
		for _, u := range []CalendarUnit{Day, Week, Month} {
			cal := Calendar{u, loc}
			_, end := cal.Bounds(time.Date(2000, 1, 1, 12, 0, 0, 0, time.UTC))
			for end.Year() < 2031 {
				if y, m, d := end.In(loc).Date(); end.Add(-time.Second).In(loc).Day() == d {
					t.Fatalf("%s: a %s starts at %s (%d-%02d-%02d local %s), not its date's first instant", zone, u, end.UTC(), y, m, d, end.In(loc))
				}
				_, end = cal.Bounds(end)
			}
		}
	}
}

// TestQuotaLateReading: a take whose clock reading came just before
// midnight, decided after a take of the new day, is counted in the new
// day (as LateReading counts a window's), not as a day of its own that
// would drop the new day's count.
func TestQuotaLateReading(t *testing.T) {
	p := Policy{Algorithm: Quota, Rate: 2, Period: Day.Nominal(), Burst: 2, Calendar: Calendar{Day, mustLoc(t, "Europe/Paris")}}
	midnight := time.Date(2025, 6, 2, 0, 0, 0, 0, p.Calendar.Loc).UnixNano()
	b, d := p.Take(State{}, false, midnight+int64(time.Millisecond), 1)
	if !d.Allowed {
		t.Fatalf("first: %+v", d)
	}
	if b, d = p.Take(b, true, midnight-int64(time.Millisecond), 1); !d.Allowed || d.Remaining != 0 || d.Reset.UnixNano() != midnight+int64(24*time.Hour) {
		t.Fatalf("the late one: %+v, want counted in the new day, none left", d)
	}
	if _, d = p.Take(b, true, midnight+int64(2*time.Millisecond), 1); d.Allowed {
		t.Fatalf("third of a quota of 2 in the new day: %+v", d)
	}
}

// TestHostTimeZoneRefused: "Local" and "localtime" (on Debian,
// /usr/share/zoneinfo/localtime links to /etc/localtime) name each host's
// own zone, which may differ across a fleet counting one quota.
func TestHostTimeZoneRefused(t *testing.T) {
	for _, name := range []string{"Local", "localtime", "LOCALTIME"} {
		if loc, err := LoadLocation(name); err == nil {
			t.Errorf("time zone %q accepted (%v): it is the host's own", name, loc)
		}
	}
}
