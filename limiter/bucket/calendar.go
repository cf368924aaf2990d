package bucket

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	_ "time/tzdata" // time zones where the host has no zoneinfo (a scratch container)
)

// CalendarUnit is the period of a quota (the Quota algorithm): a day, a
// week, a month or a year of a time zone's calendar.
type CalendarUnit uint8

// The calendar units. NoCalendar is the zero Calendar's: not a quota.
const (
	NoCalendar CalendarUnit = iota
	Day                     // from local midnight to the next
	Week                    // from Monday 00:00 to the next
	Month                   // from the 1st, 00:00, to the next 1st
	Year                    // from 1 January, 00:00, to the next
)

var unitNames = [...]string{Day: "day", Week: "week", Month: "month", Year: "year"}

func (u CalendarUnit) String() string {
	if int(u) < len(unitNames) && unitNames[u] != "" {
		return unitNames[u]
	}
	return fmt.Sprintf("calendar(%d)", u)
}

// ParseCalendarUnit parses "day", "week", "month" or "year".
func ParseCalendarUnit(s string) (CalendarUnit, error) {
	for u, name := range unitNames {
		if name != "" && name == s {
			return CalendarUnit(u), nil
		}
	}
	return NoCalendar, fmt.Errorf("unknown period %q (want day, week, month or year)", s)
}

// Nominal is the unit's longest length: a day of 25 hours, a week of
// 7 such days, a month of 31, a year of 366. A quota's Period is its
// unit's Nominal, for what bounds a policy's numbers; its windows are
// the calendar's (Calendar.Bounds).
func (u CalendarUnit) Nominal() time.Duration {
	day := 25 * time.Hour
	return [...]time.Duration{Day: day, Week: 7 * day, Month: 31 * day, Year: 366 * day}[min(int(u), int(Year))]
}

// Calendar is where a quota's periods start: at the start of each Unit
// in the time zone Loc (UTC when nil). Loc comes from LoadLocation, so
// that two calendars of one zone name are equal (a Policy is compared).
type Calendar struct {
	Unit CalendarUnit
	Loc  *time.Location
}

// locations holds the time zones loaded, by name: one *time.Location per
// name, so that calendars of the same zone compare equal.
var locations sync.Map // string → *time.Location

// LoadLocation is time.LoadLocation of an IANA name ("" is UTC), the same
// *time.Location for every call with one name.
func LoadLocation(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if strings.EqualFold(name, "Local") || strings.EqualFold(name, "localtime") { // the host's own (a link to /etc/localtime)
		return nil, fmt.Errorf("%q is each host's own time zone, which may differ across a fleet: name it, such as Europe/Paris", name)
	}
	if v, ok := locations.Load(name); ok {
		return v.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q (want an IANA name such as Europe/Paris or America/New_York)", name)
	}
	v, _ := locations.LoadOrStore(name, loc)
	return v.(*time.Location), nil
}

// Location is c's time zone: Loc, or UTC.
func (c Calendar) Location() *time.Location {
	if c.Loc == nil {
		return time.UTC
	}
	return c.Loc
}

// Bounds is the period of c that holds now: [start, end). A day is 23 or
// 25 hours when daylight saving time begins or ends in it; where local
// midnight does not exist (a change of offset at midnight), the day
// starts at its first instant. The periods partition time: the end of
// one is the start of the next.
func (c Calendar) Bounds(now time.Time) (start, end time.Time) {
	b := c.Around(now)
	return b[1], b[2]
}

// bounds is Bounds, computed.
func (c Calendar) bounds(now time.Time) (start, end time.Time) {
	t := now.In(c.Location())
	start, end = c.first(t, 0), c.first(t, 1)
	switch {
	case now.Before(start): // the local date's start resolved after now
		return c.first(t, -1), start
	case !now.Before(end):
		return end, c.first(t, 2)
	}
	return start, end
}

// first is the start of the k-th period after the one whose local date
// t has (k may be negative).
func (c Calendar) first(t time.Time, k int) time.Time {
	y, m, d := t.Date()
	loc := t.Location()
	switch c.Unit {
	case Week:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		return dateStart(time.Date(y, m, d-back+7*k, 0, 0, 0, 0, time.UTC), loc)
	case Month:
		return dateStart(time.Date(y, m+time.Month(k), 1, 0, 0, 0, 0, time.UTC), loc)
	case Year:
		return dateStart(time.Date(y+k, 1, 1, 0, 0, 0, 0, time.UTC), loc)
	}
	return dateStart(time.Date(y, m, d+k, 0, 0, 0, 0, time.UTC), loc)
}

// dateStart is the first instant of the date of day (a UTC midnight) in
// loc: its local midnight; the first of two, where the clocks fall back
// over midnight; the jump, where they spring over it (time.Date resolves
// either side of the gap or of the fold, which would hand an hour of one
// date to the period of another).
func dateStart(day time.Time, loc *time.Location) time.Time {
	y, m, d := day.Date()
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	_, before := t.Add(-6 * time.Hour).Zone()
	_, after := t.Add(6 * time.Hour).Zone()
	if before == after {
		return t
	}
	var start time.Time
	for _, off := range [2]int{before, after} { // the midnights each offset reads
		c := day.Add(-time.Duration(off) * time.Second)
		if _, o := c.In(loc).Zone(); o == off && (start.IsZero() || c.Before(start)) {
			start = c
		}
	}
	if !start.IsZero() {
		return start.In(loc)
	}
	// No midnight: the date starts at the jump, between the instants
	// the two offsets would read as its midnight.
	lo, hi := day.Unix()-int64(after), day.Unix()-int64(before)
	for hi-lo > 1 { // offsets change on whole seconds
		mid := lo + (hi-lo)/2
		if _, o := time.Unix(mid, 0).In(loc).Zone(); o == after {
			hi = mid
		} else {
			lo = mid
		}
	}
	return time.Unix(hi, 0).In(loc)
}

// Around is the start of the period before now's, now's start and end,
// and the end of the next: the windows a store may find its own clock in,
// when it is behind or ahead of this one's by less than a period. They
// are computed once per period of each calendar (aroundCache): a
// request's take reads them.
func (c Calendar) Around(now time.Time) [4]time.Time {
	v, ok := aroundCache.Load(c)
	if !ok {
		v, _ = aroundCache.LoadOrStore(c, new(atomic.Pointer[[4]time.Time]))
	}
	last := v.(*atomic.Pointer[[4]time.Time])
	if b := last.Load(); b != nil && !now.Before(b[1]) && now.Before(b[2]) {
		return *b
	}
	start, end := c.bounds(now)
	prev, _ := c.bounds(start.Add(-time.Nanosecond))
	_, next := c.bounds(end)
	b := [4]time.Time{prev, start, end, next}
	last.Store(&b)
	return b
}

// aroundCache holds each calendar's last Around (Calendar →
// *atomic.Pointer[[4]time.Time]): as many as the config's time zones
// and units.
var aroundCache sync.Map

// String is "day in Pacific/Auckland".
func (c Calendar) String() string {
	return c.Unit.String() + " in " + c.Location().String()
}

// periodStart is the start of the quota's period that holds now (Unix ns).
func (p Policy) periodStart(now int64) time.Time {
	s, _ := p.Calendar.Bounds(time.Unix(0, now))
	return s
}
