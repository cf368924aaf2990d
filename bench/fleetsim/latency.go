package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// latencies are the decisions' times (from Decide's call to its return),
// in µs, as the workers took them.
type latencies [][]uint32

// slowAt are the times lat_over counts the decisions beyond: how many a
// Redis timeout of that length would have failed (the fallback deciding
// them instead), each adding at most that long to its request.
var slowAt = []time.Duration{10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond}

// took records d in worker w's part.
func (l latencies) took(w int, d time.Duration) {
	l[w] = append(l[w], uint32(min(d.Microseconds(), 1<<32-1)))
}

// fields adds lat_us (p50/p99/p99.9/max, µs) and lat_over (the decisions
// beyond each of slowAt, per million) to a line.
func (l latencies) fields(field func(string, string, ...any)) {
	all := slices.Concat(l...)
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	at := func(q float64) uint32 { return all[min(int(q*float64(len(all))), len(all)-1)] }
	field("lat_us", "%d/%d/%d/%d", at(0.5), at(0.99), at(0.999), all[len(all)-1])
	var over []string
	for _, d := range slowAt {
		i, _ := slices.BinarySearch(all, uint32(d.Microseconds())+1)
		over = append(over, fmt.Sprintf("%s:%.0f", d, float64(len(all)-i)/float64(len(all))*1e6))
	}
	field("lat_over_ppm", "%s", strings.Join(over, ","))
}
