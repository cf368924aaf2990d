// Package fleetsync decides the zones that sync: in this process, from a share
// of what the fleet's bucket has left, reconciled with the fleet at most every
// interval (Request.Sync).
//
// A Syncer keeps, for each bucket it has seen, an allowance: the tokens this
// instance may admit on its own until its next round. A round charges the
// fleet's bucket what the instance admitted since the last one (into debt if
// need be), reads what the bucket holds after it, R, and makes the new
// allowance the instance's share of it and of what the bucket refills until
// the next round: max(0, R + rate × interval) / N, less what the instance
// admitted while the round was in flight. N is the number of instances
// counted. A Fleet is where the buckets are shared: Redis
// (limiter/redisstore's Store), or a StorageFleet, the instances that write
// their counts to one storage (a directory). Over any period the fleet admits
// at most what the exact limit admits, plus rate × interval + (N − 1)/N ×
// (burst + rate × interval), assuming N right; the overshoot is charged (the
// bucket goes into debt), so over a long period the rate is exact.
//
// # Deciding
//
// Take decides the synced requests of one HTTP request from their allowances,
// all or nothing among them, into a Taken its caller keeps from one request
// to the next (a limiter.Verdict's: with Redis, a request that none of its
// zones sends there allocates nothing here), and lists those it leaves to the
// exact store: in Redis, a bucket without an entry (its first request here,
// or any past maxSyncEntries, 2^20), a cost over the share, and every request
// while the instance is not warm (a storage fleet reads a new bucket at once,
// and decides one past maxSyncEntries by the local share). The limiter
// decides those exactly, and a refusal there gives the allowances back
// (Taken.Undo: a method of the value, as golang.org/x/time/rate's
// Reservation.Cancel, not a closure made per request). Seed
// takes their answers: the entry of a bucket's first requests in flight is
// made when the last is answered, from the answer read last in the fleet (the
// latest At; of one batched call, the least remaining), which counts the
// others' charges. What a bucket holds (held) is its limit less the tokens it
// lacks until full, negative in debt; a window's remaining, negative past its
// limit. A policy that changes (a reload, an override) caps the allowance at
// the new share and asks for a reading.
//
// A share rounds down to whole tokens, so an instance may hold none of a
// bucket that has some left (a burst under N, a refill under a token per
// interval). A request its allowance lacks cost for is therefore refused
// only when the bucket cannot hold it as the instance knows it (mayHold:
// when last read, on this instance's clock to the fraction of a token, plus
// its refill since, less what this instance admitted since); otherwise it
// is left to the fleet and decided exactly there (confirm), one request of
// a bucket at a time, and its answer is a reading. A refusal is then one
// the exact limit makes too, but for the charges of allowances, which
// reach the fleet at the next round: a bucket full when they were admitted
// refills up to rate × interval later than it would have
// (TestSyncAccuracySmallBursts: at most 1% of the requests short of an
// exact replay of the same arrivals, measured 0.04% to 0.3%). A client over
// its limit costs the fleet a call per token its rate refills, at most; the
// confirmation admits nothing the exact limit refuses, so the bound holds.
//
// # Rounds
//
// The rounds run every shortest interval of the buckets seen. A bucket is
// charged and read when it was refused for want of allowance, spent half of
// it, or its admissions waited staleAfter (ten intervals, ten seconds at
// least, also how long an idle full bucket is kept). Between two walks of
// every entry (every walkEvery, a second) a round looks only at the entries
// flagged as they were refused or spent half. Fleet.Groups splits the charges
// into parts (by node, at most 500, in Redis), each applied on its own
// (applyPart): a part certainly not sent is charged at the next round; one
// that may have run (bucket.MayHaveRun) is counted charged, and read next
// time: nothing is sent twice. Close makes a last round that charges what is
// left. A token bucket's charge is made as of the instance's last request
// of it (its age, so that clocks need not agree: see gcra.lua): a bucket
// that was full then is not charged from now, which would take from it
// what it refilled after those admissions, and refuse what the exact
// limit admits.
//
// The windows (fixed, sliding counter) sync as the token bucket does: the
// window's limit is the burst, an allowance has no refill, and a bucket is
// read again as its window turns. A charge counts past the limit, and what
// went over carries into the next window (see luascripts/common.lua), so the
// fleet admits the limit of each window it touches and the bound once. A
// quota syncs as a window of its calendar's periods (windowTurns), with
// no carry: a new period starts whole, at the instance's share of the
// quota, and what an instance admitted of a period that turned before it
// was charged is dropped, not charged to the next (periodTurned), so the
// bound holds once per period; a reading of a period that turned while
// its round was in flight is not applied (the turn is never set back). A
// policy changed under a window or a quota leaves its count unknown, so
// that a request past the allowance is decided in Redis rather than
// refused on the old limit's reading. The
// sliding log, the leaky bucket, concurrency, bans and zones that settle do
// not sync: the root package refuses them at config time.
//
// # Instances
//
// An instance registers every second (registerEvery) from its first request of
// a zone that syncs, and counts those registered within InstancesWindow (ten
// seconds): in Redis a sorted set on Redis's clock, in a storage the files
// written lately. N is never below on_store_error local's instances; a lower
// count is taken only once no registration has counted N or more for
// InstancesWindow; when N grows, every allowance shrinks in proportion at
// once. An instance hands out no share until it is warm (registered twice, a
// second apart, with no gap of InstancesWindow): until then it decides in the
// fleet, exactly. A failed registration is reported as a failed round
// (Events.Synced). Count counts as a config loads, registering nothing.
//
// # Failure
//
// While rounds fail, an instance admits, beyond its allowance, its share of
// the limit in memory (bucket.InstanceShare(policy, N) on a memstore.Store), and
// keeps what it admitted to charge, at most a burst, when the fleet answers
// again.
//
// # Through a storage
//
// A StorageFleet counts, per bucket, what this instance admitted by window
// (StorageCounts: the window's start, its count and the previous one's), only
// for the windows, whose counts add up across instances. It writes them to
// <Dir>/<instance>.json (DefaultStorageDir) every WriteEvery and reads the
// others' every ReadEvery; a bucket as the fleet counts it is the sum of every
// instance's counts at now's window (a clock reading late for a count's
// window, read before the lock, is taken in that window: bucket.LateReading).
// Its readings are made in memory, so the
// Syncer charges admissions as they are made and reads a bucket whenever the
// fleet read the others' files since (generation) or its window turned. A
// reading is the limit less every count, less (N − 1) times what this instance
// charged since the oldest file it read was written (unseen, kept by epoch, up
// to maxEpochs): the others' admissions since their writes, which the view
// lacks. A cost over the share is decided by the bucket's owner alone (owns:
// the digest and the window's index over the instances' sorted names, so that
// the owner moves on each window), on what the fleet left (Left).
//
// Instances are those whose file was written within InstancesWindow (three
// WriteEvery at least) and is not marked stopped, at most MaxStorageInstances,
// this one included; one whose file the read's budget skipped counts blind,
// its share taken as spent (blindShare). Every storage call runs in a
// goroutine of its own within Timeout, one at a time per key (call): a storage
// need not honour its context. The directory is untrusted input
// (storagefiles.go): only files named as an instance names its own are read,
// regular files only on a FileSystem, within a byte and bucket budget
// (MaxFileSize; smallest first); a file written more than 30 s ahead is not
// counted; a file skipped is reported once (StorageEvents.FileSkipped); with
// a secret, a file is used only when signed with it (see A secret). A
// reader deletes files not written for PurgeAge, or else faded and not written
// lately; an instance that stops deletes its own file when it holds nothing
// (with a secret, it writes it, stopped).
// While the others' files cannot be read for three ReadEvery, or this one's
// written for three WriteEvery, ChargeAll fails with errStorageStale (charging
// nothing), and the Syncer admits by the local share; StorageEvents hear each
// failure and recovery once. Files hold digests, never a client key.
//
// # A secret
//
// With StorageOptions.Secret, each instance signs its file (storagemac.go):
// HMAC-SHA-256, under a key derived from the secret, of every byte of the
// file but the MAC, so of the format's version, the instance's name, its
// write time, whether it stopped, and every count (zone, algorithm,
// digest, window); a reader checks it, in constant time, on the bytes it
// read, before it parses them. A file not so signed (no MAC, or another
// secret's, or altered) is skipped and reported once, by its name, and
// is no instance, not even a blind one; nor is a file too large to read,
// whose time is the storage's, not the instance's word. Of a signed file,
// a reader ignores (and reports once) one whose instance is not its name
// (a copy), one written more than 30 s ahead of its clock (not
// remembered), and one written before the file of its instance it
// accepted last (a replay: storagereplay.go). It remembers the last file
// it accepted of each instance (at most 256), and an instance whose file a
// read then does not accept (missing, rejected, unreadable), or whose file
// accepted was not rewritten within InstancesWindow, is hidden: unless its
// last file said it stopped, it counts blind (in N, its share of every
// bucket taken as spent, its last counts still counted), from that read
// until the horizon: PurgeAge after its last accepted file was written,
// when set; else once that file would be purged (its counts faded,
// InstancesWindow past) and two of the longest window this instance has
// counted (a request of its own, a count read) have passed since it was
// written. Then it is forgotten, as an instance that stopped. An instance
// says it stops by its last file, Stopped and signed; with a secret it
// writes one even when it holds nothing (a deletion says nothing), and
// the others count it no more at their next read.
//
// Without a secret, whoever can write the directory can lift the limits (the
// files rewritten with no counts: the others' admissions vanish from each
// view, the fleet tends to N times the limit), squeeze them (files of
// made-up instances written now: N up to MaxStorageInstances, a share of
// 1/64), or refuse a client (a file counting its bucket full: its digest is
// in the files, keyed or not). With one, no forged file changes a decision,
// nor does a replay or a copy of a signed file; and whoever deletes or
// overwrites the files only squeezes, for at most the horizon: a reader
// that cannot read an instance takes its share as spent on top of its last
// counts, so each instance admits at most what the limit leaves once every
// instance it cannot see has spent its share, and the fleet stays within
// the limit and the bound (TestStorageHiddenNoLift: every file rewritten
// empty, or deleted, every 50 ms for 30 s), while each hidden instance
// costs the others its share, Rate/N of every bucket. The price of the
// same rule: an instance that crashed (no stopped file) counts blind as
// long, and the fleet admits its share less, in every bucket, until the
// horizon (two of the longest window by default; PurgeAge bounds it).
// Past the horizon, an instance still hidden is forgotten: if it still
// reads the others, it sees what they admit and lifts nothing; instances
// hidden from one another for longer than the horizon (every file kept
// hidden so long) decide alone, each on its last view: up to N times the
// limit from then on. Nor is a file frozen hidden at once: its own last
// signed file put back over each newer one before any reader accepts that
// is accepted as it is (no replay: no newer one was seen) until
// InstancesWindow after it was written, and what its instance admits
// meanwhile is unseen; with every file frozen so, each instance decides
// on its last view of the others for that long, then counts them blind.
// The files stay readable (zone names, counts,
// digests: keyed by the same secret at the root, not testable against
// guesses of keys). Fleets that share a secret trust each other's files:
// a file copied from one's directory to another's counts there. Without
// a secret nothing is remembered: a file is what it says, and a file
// hidden counts as one deleted.
//
// # Invariants
//
//   - A synced zone stays within its bound: TestSyncOvershootBounded,
//     TestSyncWindowsBounded, TestSyncWindowsPaced, TestStorageFleetBounded,
//     TestStorageFleetShortWindows; end to end TestSyncOvershootEndToEnd
//     (internal/e2e).
//   - A cost over the share is decided exactly: TestSyncCostOverShare,
//     TestStorageFleetCostOverShare, TestStorageFleetOwnerTurns.
//   - What was admitted stays counted across a restart:
//     TestSyncRestartReadsRedis, TestStorageFleetStopped.
//   - N as stated above: TestSyncFloorInRounds, TestSyncCountAfterEmptyRedis,
//     TestSyncFleetStartsTogether, TestSyncShareShrinksAsFleetGrows,
//     TestSyncRegistrationFailureReported, TestStorageFleetTellsInstances.
//   - A failing fleet means the local share, then no more than the bound:
//     TestStorageFleetFailing, TestStorageFleetWriteFails.
//   - A reading late for a bucket's window forgets none of its counts:
//     TestStorageLateReading (internal: it sets the fleet's clock).
//   - Rounds charge buckets of any slot in a cluster: TestSyncManyKeysCluster.
//   - What lies in the directory costs a timeout at most, once, and no raw
//     key is written: TestStorageFleetHostileFiles, TestStorageFleetFiles,
//     TestStorageFilesDevices, TestStorageFilesLinkedDir,
//     TestStorageFilesManyInstances, TestStorageFilesOversized,
//     TestStorageFilesSwapped, TestStorageFilesAhead,
//     TestStorageFilesTooLargeCounted, TestCompatDistributed (internal/e2e).
//   - With a secret, no file written without it changes a decision, nor an
//     older or copied signed file: TestStorageMACAttacks,
//     TestStorageMACLiftAlone, TestStorageMACReplayAndCopy,
//     TestStorageMACUnsigned, TestStorageMACFleet, TestStorageReplayAhead;
//     a file hidden (deleted, rewritten) squeezes, never lifts, until the
//     horizon: TestStorageReplayDeleted, TestStorageHiddenNoLift,
//     TestStorageHiddenCrashed, TestStorageHiddenStopped (internal: they
//     set the clocks).
//
// The tests are an external test package but for TestStorageLateReading,
// TestStorageReplay* and TestStorageHidden*:
// those of a Redis fleet decide through Limiters (limiter.New), those of a
// storage fleet through a StorageFleet and the Syncer of its zones, made
// as limiter.New makes them (instance_test.go).
//
// # Imports
//
// limiter/bucket (requests, policies, InstanceShare, MayHaveRun to tell a
// part that charged nothing), limiter/memstore (the local share),
// internal/jsonerr (errors of another instance's file) and the
// standard library; no go-redis: Redis is a Fleet the limiter hands it. The
// limiter package imports it.
package fleetsync
