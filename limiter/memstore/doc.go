// Package memstore keeps rate-limit buckets in this process's memory.
//
// A Store is a limiter.Store that never fails: a map of bucket states
// (bucket.State) by bucket (bucket.ID: zone, algorithm, key digest), split
// into 64 shards, each under its own mutex. It is exact for one instance. It
// is the store of a handler without Redis (with a storage fleet, of its zones
// that do not sync), on_store_error local's fallback (each limit divided by
// the instances), the store of a Redis zone's bans while its node's breaker is
// open, and the local share of a zone that syncs while its rounds fail. It
// keeps at most its capacity of buckets, and a sweeper drops the buckets back
// to their initial state (a missing bucket stands for one), so memory holds
// active clients only.
//
// # Takes, all or nothing
//
// A bucket's shard is the first 8 bytes of its digest modulo 64 (memShard is
// padded to 64 bytes). Inside a shard, buckets are in groups, one map per zone
// and algorithm (memGroup, by the 16-byte digest); memShard.n counts them all.
// TakeAt locks the shards of every request's bucket in ascending order (no
// deadlock between takes of several keys), decides each request in turn with
// Policy.Take on its bounded cost (bucket.BoundedCost), and, when one is
// refused, restores every bucket in reverse order from the copies saved before
// (savedBucket): no other take comes between a charge and its rollback, and
// since Take changes no log or slots in place, the copies are the states
// before. Only a committed take names its concurrency slots
// (bucket.State.Hold), so a rolled-back take names none. Every decision
// carries At, the one clock reading of the take. Take is TakeAt at time.Now;
// TakeAt is TakeInto with no room (TakeInto writes the decisions into the
// caller's slice when it has room: the Limiter's Verdict keeps one).
//
// Release frees each request's own slot by its ID (a slot taken before a Reset
// frees none taken after it). Peek decides a cost of 0 at the current time,
// changing nothing. Reset drops the bucket and the client's ban.
// Refund/RefundAt and Charge/ChargeAt apply bucket.Policy.Refund and
// bucket.Policy.Charge under the bucket's shard lock (update), dropping a
// bucket left with nothing to keep; they evict nothing.
//
// # Bans
//
// memBans holds a banState per bucket.ID: the refusals counted, when their
// window ends, and when a ban ends. RefusedAt counts a refusal (one after the
// window's end starts a new window of Ban.Within); reaching Ban.After bans the
// client for Ban.For and clears the count. BannedAt tells the ban left. The
// sweep drops what has expired. Refused and Banned read the clock; they never
// fail.
//
// # Sweeps and capacity
//
// The sweeper runs every DefaultSweepInterval (30 s; New's argument otherwise)
// until Close: it drops the buckets idle at now and the empty groups, and
// copies into a new map a group whose map grew past 1,024 buckets and fell
// under a quarter of its peak (Go maps never shrink). A bucket idle at now is
// a fresh one even before the sweep drops it.
//
// SetCapacity (default DefaultCapacity, 500,000 buckets; at least MinCapacity,
// a bucket per shard) gives each shard its part of the capacity
// (memShard.limit). After a committed take, each bucket it added to a shard
// then over its limit evicts one other bucket of that shard (makeRoom,
// evictOne), under the locks the take holds; two while the shard stays over a
// lowered limit. Of up to 5 buckets (evictSample) met from each group's random
// iteration start (pick), the take's own left out, evictOne drops:
//
//  1. an idle bucket of the adding zone's group;
//  2. else an idle bucket of another group;
//  3. else the adding zone's bucket that would be idle soonest (the least
//     held back);
//  4. only when the adding zone has none there, the one that would be
//     idle soonest of the group that holds the most buckets.
//
// A bucket of another zone that holds back tokens thus goes only while the
// shard holds no bucket of the adding zone: a flood of new keys in one zone
// evicts its own buckets before other zones' clients (of those, at most one a
// shard: the flood's first bucket there). A concurrency bucket that holds
// slots (idle at the maximum) goes last in its group. An evicted client starts
// afresh: the capacity bounds memory, not what a client may do. A refused take
// adds no bucket, so it evicts none. A refund or charge (update) may bring
// back an evicted bucket without evicting; the next added bucket or the next
// sweep, which trims a shard over its limit exactly (trim: the soonest idle
// first), brings the shard back to its limit. Evictions are counted
// (Evictions) and told to the function OnEvict sets, outside the locks. A
// bucket's heap (TestMemoryFootprint holds it to 256 B at the default
// capacity) is measured in BENCHMARKS.md (Memory store per bucket).
//
// # Time
//
// TakeAt, RefundAt, ChargeAt, BannedAt, RefusedAt and Sweep take the time as a
// parameter, for tests and callers with a clock of their own (the limiter
// decides with one reading per request); Take, Refund, Charge, Banned,
// Refused, Release and Peek read time.Now.
//
// # Invariants
//
//   - A refused request takes nothing from any of its buckets:
//     TestAllOrNothing, TestMixedAlgorithmsAllOrNothing (package limiter).
//   - Exact under concurrency: TestMemoryConcurrentExact; zones and keys
//     are distinct buckets: TestMemoryZonesAndKeysAreDistinct.
//   - Idle state is dropped and its memory given back:
//     TestMemorySweepDropsFullBuckets, TestMemoryFloodShrinks,
//     TestMemoryKeyFlood (package limiter, which also checks that only
//     digests are kept), TestMemoryCloseStopsSweeper.
//   - At most the capacity, the least held back evicted first:
//     TestMemoryCapacityEvicts, TestMemoryCapacityLowered,
//     TestMemoryFootprint (in limiter/redisstore's footprint_test.go).
//   - A flood in one zone evicts its own buckets, not other zones'
//     clients: TestMemoryFloodKeepsOtherZones,
//     TestMemoryFloodEvictsItsOwnZone, and through handlers
//     TestMemoryFloodSparesOtherZones (root package).
//   - The algorithms decide as in Redis (package limiter's conformance tables);
//     a reset frees no slot taken after it: TestConcurrencyReset.
//
// # Imports
//
// limiter/bucket (the states, decisions and arithmetic) and the standard
// library. The limiter package imports it (its memory store, the fallback,
// bans while a breaker is open), and so does limiter/fleetsync (the local
// share).
package memstore
