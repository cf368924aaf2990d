// Package overrides keeps the run-time overrides of the limits: changes to a
// zone's policy, or to one client key's, made without a config change.
//
// An Override is one override: of a zone (its rate and burst or
// max_concurrent, its dry run, the whole zone disabled) or of one key in a
// zone (a limit of its own, a block, an exemption), each in force until an
// optional expiry. Its JSON is what Redis stores, and Override.Check is the
// one validation of its shape, for the admin API and for every entry read. A
// Set is an immutable snapshot: zone → override, and zone → key digest →
// override. Overrides holds the Set in force in an atomic pointer and replaces
// it whole: a request reads it with one atomic load (Current) and at most two
// map reads per zone (Set.Zone, Set.Key). The overrides live in this process
// (NewMemory) or in the Redis a fleet shares (NewRedis), where one instance's
// change reaches the others.
//
// # Order
//
// Each change of an entry (an override, or a tombstone: its deletion)
// carries a Stamp and its origin: (ms, n, origin), ordered
// lexicographically, ms and n integers below 2^53 (exact in Lua's
// doubles), origin the changing instance's random id in hex. Each
// Overrides stamps its changes (PutStamped, DeleteStamped) by a hybrid
// logical clock (stamp.go): ms is the greater of its clock (Overrides.now)
// and the latest ms it made or read, n counts within that ms; every Set
// installed moves it past the entries' latest stamp (Set.newest). A change
// made after reading another's thus comes after it whatever the clocks
// say; two changes made without reading each other are ordered by their
// clocks, so a clock N seconds ahead wins for N seconds. An entry without
// a stamp (written by an earlier version), or that cannot be decoded,
// comes first. Every store keeps, for each entry, the latest change: a
// change, a copy to another region (Writer), and a write-back all merge
// entry by entry, and none replaces a set. A deletion is a tombstone
// ({"deleted":true, ...}) kept until the override it deletes would have
// expired, or TombstoneTTL (7 days) for one without expiry; a Set keeps
// its tombstones apart from the overrides (deadZones, deadKeys): no
// request looks at them, they count in MaxEntries, and they are written
// back like the overrides.
//
// # Effect
//
// Set.Effect is the one place that says what the overrides in force do to
// one request of a zone (effect.go), for the requests (the root package's
// Zone.override) and for the admin API's zones listing and lookups alike,
// so that what the admin shows is what is enforced. The caller gives the
// zone as a Target: its name, the config's policy for the request, whether
// the config writes a burst, and what else a policy must pass in the zone.
// The zone's override applies first, then the key's: Disabled, Exempt (the
// key passes uncounted; nothing else is looked at), Block (until the
// override expires, at most MaxBlock), DryRun, and the Policy in force. An
// override's limits that the zone's algorithm does not take (Override.Fits)
// are left out, and so are those that give a policy the zone refuses: the
// policy under both overrides falls back to the zone's alone, then to the
// config's. Effect.LeftOut says why, and the caller logs it. A Clock is read
// once per request, and only for an override with an expiry; Effect
// allocates nothing but the reason of limits left out.
//
// # In Redis
//
// After the store's key prefix, in one hash slot (the tag {overrides}, which
// no bucket key has: their tags are 16 characters):
//
//	{overrides}          hash: "zone:<zone>" | "key:<32 hex digest>:<zone>" → JSON
//	{overrides}:version  "<n>:<nonce>", a new nonce for every change; n in digits
//	                     (string.format('%.0f'): tostring prints 1e+14)
//	{overrides}:expiry   sorted set: entry name, scored by its expiry (Unix ms)
//	{overrides}:changed  the channel of the changes (+ ":db<n>" in a database n ≠ 0)
//
// A change is one script (luascripts/overrides_write.lua): the entry written
// (an override or a tombstone) unless Redis holds a later change of it
// (the script says which: 'written', 'same' or 'later'; all three mean
// Redis holds this change or a later one), its expiry recorded, the
// entries expired by Redis's clock
// dropped (at most 1,000 per change, through the sorted set), the version
// moved on, and the change announced from inside the script, so that messages
// come in the order of the changes: "<previous version> <new version> <entry
// names>". It publishes with PUBLISH, and in a cluster SPUBLISH too, where
// instances subscribe to the shard channel when the nodes know SSUBSCRIBE. A
// change not written, with nothing expired, changes nothing: the version
// stays. The nonce makes a version name one change: after a lost write, the
// next change has the lost one's number but not its name, so no instance takes
// it for what it holds. Put and Delete apply the change made here from the
// script's reply, without a read (applyOwn); expiries are set on Redis's clock
// (Now).
//
// # Reading
//
// One goroutine per Overrides (run) reads: on a push, on a subscription made
// again (what was published meanwhile is lost), every poll interval (SetPoll;
// DefaultPoll, 10 s), and at the next expiry (at most once a second: requests
// check expiries themselves). Reads are serialised and at least 100 ms apart;
// while they fail they are tried every second (failRetry) and the last Set
// stays in force, its failure and recovery reported once
// (Events.OverridesFailing). An instance at a message's previous version reads
// only the entries named and applies them to a copy of its Set (a zone's key
// overrides are 256 maps by the digest's first byte: a change copies 256
// pointers and the one map it touches). Any gap (a message missed, a version
// of another nonce, more than maxPending messages or maxPushedNames names
// queued) is a whole read: HSCAN in pages of 1,000 inside
// luascripts/overrides_read.lua, parsed page by page, between two readings of
// the version that must agree (three tries; else the Set is labelled as no
// version, and the next poll reads again). Start reads once before it returns,
// so a config that loads serves the overrides in force from its first request.
// A subscription that Redis does not confirm within 10 s (an ACL without the
// channel) is reported once (OverridesNotPushed): the changes come through the
// poll.
//
// Whoever can write Redis can write the hash and publish on the channel, so
// what is read is bounded: at most MaxEntries (100,000) entries, the rest left
// out and reported once (OverridesOverLimit); the read script leaves in Redis,
// and names, every entry whose name passes 1 KiB or value 2 KiB; a message of
// more than 1,001 names, a version past 64 bytes or a name past 1 KiB is read
// as no change: the version is read instead. Whole reads (and restores) start
// at least wholeReadGap (1 s) after the last started and wholeReadSpan (10)
// times its length after it ended (putOff, wholeRead), so version bumps cannot
// keep an instance reading. Stored JSON is read leniently (unknown fields
// ignored, for rolling upgrades), then checked; a malformed entry is left out
// and reported once per entry and value (OverrideSkipped).
//
// # Write-backs
//
// No change moves the version back. Every whole read merges both ways
// (restore.go): the instance takes what Redis holds, and writes back,
// through luascripts/overrides_restore.lua, every entry it holds
// (override or tombstone, not expired) that Redis lacks or holds an
// earlier change of; the script keeps the later change of each and drops
// what Redis's clock expired. When it writes some, the version moves
// beyond both the one found and the one held, the entries written are
// announced by name (none past 1,000: a whole read), and the instance
// reports it (OverridesRestored). This covers a Redis that lost the
// overrides (a restart without persistence, a failover to a lagging
// replica, an eviction), a copy that landed on such a Redis (it stays, the
// rest is written back around it), and an instance that writes back an
// older state (one that holds the later change, a tombstone, writes it
// back over it at its next whole read). Any number of instances may write
// back at once. An entry removed from Redis without a tombstone (by hand,
// or by an earlier version's delete) is written back like a lost one.
//
// # Digests
//
// A key's override is stored under the digest the zone's KeyHasher gives (the
// caller computes it: HMAC under key_secret, else SHA-256; with neither Redis
// nor a storage, the process's maphash pair), so that it names exactly the
// bucket a request names. The raw key is never stored. Set.Entries lists
// digests in hex; ParseDigest reads one.
//
// # Invariants
//
//   - Overrides cost no Redis call per request, and a Set is whole; a
//     change reaches every subscribed instance at once, any instance within
//     the poll: TestRedisOverridesReachEveryInstance,
//     TestRedisOverridesPollHeals, TestRedisOverridesShardFailover,
//     TestRedisOverridesNotPushed, TestMemoryOverrides, and end to end
//     TestFleetOverrides (internal/e2e).
//   - Whatever Redis holds, what an instance reads is bounded and spaced:
//     TestRedisOverridesEntriesCapped, TestRedisOverridesOversizedEntries,
//     TestRedisOverridesWholeReadsSpaced, TestRedisOverridesWholeReadRacing.
//   - The overrides survive a Redis that loses them, and the latest change
//     of each entry stands everywhere: TestRedisOverridesSurviveEmptyRestart,
//     TestRedisOverridesSurviveMasterRestart,
//     TestRedisOverridesLostWriteRestored,
//     TestRedisOverridesDivergedMerged,
//     TestRedisOverridesPartitionHealsToLater,
//     TestRedisOverridesSkewedClockLaterWins,
//     TestRedisOverridesCopyToEmptyRedisKept,
//     TestRedisOverridesDeletedStaysDeleted,
//     TestRedisOverridesOwnPushReadFirst,
//     TestFleetOverridesSurviveAnEmptyRedis (internal/e2e).
//   - While Redis fails, the last Set stays:
//     TestRedisOverridesKeepLastWhenDown; expired overrides leave Redis and
//     the Set: TestRedisOverridesExpireInRedis.
//   - Versions stay integers past 1e14: TestRedisOverridesVersionStaysInteger.
//   - Shapes are checked once, the same for every source: TestOverrideCheck.
//   - One computation of an override's effect, read the clock only when an
//     expiry needs it: TestEffect, TestEffectReadsTheClockOnce; the admin
//     API shows what requests get: TestOverrideEffectAgrees (root package).
//   - No raw client key in an override: TestOverridesListing,
//     TestOverrideAdminErrors (root package), TestFleetOverrides.
//
// The cost of one change among many keys is BenchmarkOverrideApplyOneKey, of a
// whole read BenchmarkRedisOverridesRead: figures in BENCHMARKS.md.
//
// # Imports
//
// limiter/bucket (ParseRate and MaxRate, to check an override's numbers;
// Policy, Algorithm and DefaultBurst, for an override's effect),
// luascripts (the three scripts), go-redis, internal/jsonerr (JSON errors
// described by position, never echoing a value) and the standard library. The
// root package imports it and holds one Overrides per store; the limiter
// facade does not.
package overrides
