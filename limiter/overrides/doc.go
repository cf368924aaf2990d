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
// or deleted, its expiry recorded, the entries expired by Redis's clock
// dropped (at most 1,000 per change, through the sorted set), the version
// moved on, and the change announced from inside the script, so that messages
// come in the order of the changes: "<previous version> <new version> <entry
// names>". It publishes with PUBLISH, and in a cluster SPUBLISH too, where
// instances subscribe to the shard channel when the nodes know SSUBSCRIBE. A
// delete of an entry that does not exist, with nothing expired, changes
// nothing. The nonce makes a version name one change: after a lost write, the
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
// # Restores
//
// No change moves the version back, and a delete moves it on: a version gone,
// or at a number below the one held, means Redis lost the overrides or their
// last changes (a restart without persistence, a failover to a lagging
// replica, an eviction). The instance that finds it writes back what it holds
// that has not expired (luascripts/overrides_restore.lua: only while the
// version is still the one read, with a version beyond both), and reports it
// (OverridesRestored); the others find the version moved on and read it. A
// change that lands on such a Redis writes back the rest with it. A version of
// the number held but another nonce is a history of its own: read, not
// overwritten.
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
//   - The overrides survive a Redis that loses them, and never overwrite a
//     history of its own: TestRedisOverridesSurviveEmptyRestart,
//     TestRedisOverridesSurviveMasterRestart,
//     TestRedisOverridesLostWriteRestored,
//     TestRedisOverridesDivergedNotRestored,
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
