package main

import (
	"math"
	"math/rand/v2"
	"slices"
)

// zipf draws keys 0 to n-1, key k in proportion to 1/(k+1)^s: any s ≥ 0
// (math/rand's Zipf wants s > 1; web traffic is nearer 1, and below).
type zipf struct {
	cdf []float64 // cdf[k]: the weights of keys 0 to k, added up
}

// newZipf is the distribution of n keys of exponent s.
func newZipf(n int, s float64) *zipf {
	z := &zipf{cdf: make([]float64, n)}
	sum := 0.0
	for k := range n {
		sum += math.Pow(float64(k+1), -s)
		z.cdf[k] = sum
	}
	return z
}

// draw is a key, by rng.
func (z *zipf) draw(rng *rand.Rand) int {
	u := rng.Float64() * z.cdf[len(z.cdf)-1]
	k, _ := slices.BinarySearch(z.cdf, u)
	return min(k, len(z.cdf)-1)
}

// share is key k's share of the draws.
func (z *zipf) share(k int) float64 {
	w := z.cdf[k]
	if k > 0 {
		w -= z.cdf[k-1]
	}
	return w / z.cdf[len(z.cdf)-1]
}
