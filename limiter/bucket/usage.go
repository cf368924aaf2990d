package bucket

import (
	"cmp"
	"slices"
)

// Use is one key's use of a quota's period: the digest its store keeps
// (hex: 16 bytes in memory, the 12 of the hash tag in Redis) and its count.
type Use struct {
	Digest string `json:"digest"`
	Used   int64  `json:"used"`
}

// QuotaUsed is what quota bucket b counted in the period that holds now
// (Unix ns): 0 for a count of another period.
func (p Policy) QuotaUsed(b State, now int64) int64 {
	if p.Algorithm != Quota || b.last != p.periodStart(now).UnixNano() {
		return 0
	}
	return int64(b.tokens)
}

// TopUses is the n uses of the most, most first (by digest among equals),
// each digest once, with the most it was given (a Redis SCAN may return a
// key twice).
func TopUses(uses []Use, n int) []Use {
	slices.SortFunc(uses, func(a, b Use) int { return cmp.Or(cmp.Compare(a.Digest, b.Digest), cmp.Compare(b.Used, a.Used)) })
	uses = slices.CompactFunc(uses, func(a, b Use) bool { return a.Digest == b.Digest })
	slices.SortFunc(uses, func(a, b Use) int { return cmp.Or(cmp.Compare(b.Used, a.Used), cmp.Compare(a.Digest, b.Digest)) })
	return uses[:min(n, len(uses))]
}
