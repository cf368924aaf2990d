package bucket

import (
	"testing"
	"time"
)

// TestWindowsLateReading: takes are not decided in the order of their
// clock readings (concurrent takes, a take that waited for a lock). One
// whose reading falls in the window before the bucket's, decided after
// takes of the bucket's window spent it, is counted in the bucket's
// window: refused, and the window keeps its count (it is not taken for a
// fresh window of its own, whose count the next take would drop again).
func TestWindowsLateReading(t *testing.T) {
	for _, algo := range []Algorithm{FixedWindow, SlidingWindowCounter} {
		p := Policy{Algorithm: algo, Rate: 3, Period: time.Second, Burst: 3}
		start := int64(100 * time.Second) // a window's start
		var b State
		take := func(now int64) bool {
			var d Decision
			b, d = p.Take(b, b.IdleAt != 0, now, 1)
			return d.Allowed
		}
		for i := range 3 {
			if !take(start + int64(i)) {
				t.Fatalf("%s: take %d of 3 refused", algo, i+1)
			}
		}
		if take(start - 1) { // read 1 ns before the window began
			t.Errorf("%s: a take read before the window began, decided after 3 of 3 were taken in it, admitted", algo)
		}
		if take(start + 10) {
			t.Errorf("%s: after a late take, the window's 3 of 3 were forgotten: one more admitted", algo)
		}
	}
}
