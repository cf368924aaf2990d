package fleetsync

// A storage fleet's counts of a bucket, by window (see storage.go for the
// model).

import "github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"

// StorageCounts are one instance's counts of a bucket: of the window of
// Period that starts at Start (Unix ns), and of the one before.
type StorageCounts struct {
	Zone   string `json:"z"`
	Algo   string `json:"a"`
	Digest string `json:"k"` // hex
	Period int64  `json:"w"`
	Start  int64  `json:"s"`
	Curr   int64  `json:"c"`
	Prev   int64  `json:"p"`
	// epochs is what this instance charged in each of the last epochs (an
	// epoch ends at a read of the others' counts; the fleet's epoch, mod
	// len, is the current one): the others may not have seen them yet.
	epochs [maxEpochs]int64
}

// at is c taken at now's window: its count and the previous one's.
func (c StorageCounts) at(now int64) (curr, prev int64) {
	now = bucket.LateReading(now, c.Period, c.Start)
	start := now - now%c.Period
	switch c.Start {
	case start:
		return c.Curr, c.Prev
	case start - c.Period:
		return 0, c.Curr
	}
	return 0, 0
}

// weighed is what c counts against a limit of algo at now: a fixed
// window's count, a sliding counter's with the previous one's part still
// in the sliding window.
func (c StorageCounts) weighed(algo bucket.Algorithm, now int64) float64 {
	now = bucket.LateReading(now, c.Period, c.Start)
	curr, prev := c.at(now)
	if algo == bucket.SlidingWindowCounter {
		return float64(prev)*(1-float64(now%c.Period)/float64(c.Period)) + float64(curr)
	}
	return float64(curr)
}
