// Package bucket holds the types that every store and caller of the limiter
// share, and the arithmetic of every algorithm.
//
// A Policy is a limit: an Algorithm, Rate requests per Period, and Burst. For
// the token bucket, Burst tokens refilled at Rate per Period; for the windows,
// Rate requests per window of Period (Burst is Rate); for the leaky bucket,
// requests leave at Rate per Period and up to Burst more wait their turn (none
// with NoDelay); for the concurrency limit, Slots requests in flight, each a
// slot that lives at most Lease in Redis. Ban bans a client refused After
// times within Within, for For. A Request asks a store to charge Cost from the
// bucket of Key in Zone; the store answers with a Decision, whose At is the
// store's time of it. A State is what the memory store keeps of a bucket:
// Policy.Take decides a request on a State at a time and returns the State to
// keep if the store commits the charge. The Redis scripts (luascripts) keep
// the same state in their own formats and decide alike.
//
// # Algorithms
//
// Algorithm is TokenBucket, FixedWindow, SlidingWindowLog,
// SlidingWindowCounter, LeakyBucket or Concurrency. One spec per algorithm
// (specs) says what sets it apart: its name, whether it is windowed (Rate per
// Period, no burst of its own), syncs (token bucket, fixed window, sliding
// counter), may go into debt (token and leaky buckets: Charge charges it) and
// may be named by a zone (all but Concurrency, which max_concurrent sets);
// String, ParseAlgorithm, Windowed, Syncs and Debt read it. Its arithmetic is
// its case in Take, Refund and Charge. Policy is comparable: a RefusedCache
// compares it, and it keys the texts of responses. Validate bounds it (see
// below).
//
// A State idle at now (IdleAt passed) is a fresh bucket, as an expired Redis
// key is. Take never changes a State's log or slots in place, so that a store
// keeps a copy of the State before a take to roll it back.
//
// # GCRA: the token and leaky buckets
//
// Both buckets keep one time, GCRA's theoretical arrival time (TAT): when the
// requests charged so far are paid for at the rate. Each unit of cost moves it
// on by one interval (Policy.Interval, Period/Rate), from now when it is past:
//
//	interval = period / rate            full = burst × interval
//	slack    = min(1 µs, interval / 2)  room = full + slack
//	wait     = max(TAT − now, 0)        (0 for a fresh bucket)
//	token bucket  keeps TAT − full ("when it was empty")
//	              allowed ⇔ cost ≤ burst and wait + cost × interval ≤ room
//	              remaining = ⌊(room − wait') / interval⌋, reset = now + wait'
//	              retry = wait + cost × interval − full (cost > burst: the
//	              time to full, at least an interval)
//	leaky bucket  keeps the TAT; allowed ⇔ wait ≤ room and cost ≤ burst + 1
//	              delay = wait (0 with NoDelay); remaining = ⌊(room − wait') /
//	              interval⌋ + 1; retry = max(wait − full, 1 µs)
//
// Times are Unix ns, rounded up (roundTAT), so a bucket refills at most 1 ns
// per charge late; slack, the resolution of Redis's clock, absorbs that
// rounding (at most half an interval: no extra request passes). The token
// bucket's kept time does not depend on the policy: when a zone's policy
// changes, its tokens carry over, capped at the new burst, and a new rate
// changes the time they took to refill.
//
// # Windows, log, counter, slots
//
//   - Fixed window: windows start at multiples of Period (index
//     now/Period); the State holds the index and its count, so a window of
//     another length starts afresh. Up to twice Rate passes across a
//     window's edge. A refusal waits for the window's end.
//   - Both windows: a take whose time falls in the window just before the
//     State's (concurrent takes are not decided in the order of their
//     clock readings) is taken at the start of the State's window, not as
//     a window of its own that drops the count (LateReading).
//   - Sliding window counter: weight = 1 − (now − start)/Period; allowed
//     when prev × weight + curr + cost ≤ Rate (within epsilon); the retry
//     is when prev has faded enough, or in the next window; the reset when
//     both windows have faded.
//   - Sliding window log: a time per counted unit; entries at or before
//     now − Period have left; a refusal waits until the
//     (count + cost − Rate)-th oldest leaves.
//   - Concurrency: a committed take names its slot by the request's ID
//     (State.Hold); Policy.Release frees only its own, so a slot taken
//     before a reset frees none taken after it. IdleAt is the maximum until
//     the last release; the retry is a guess of a second.
//
// # Refunds and charges
//
// Policy.Refund gives back at now what a take's charge still holds back, given
// the take's decision (its At and Reset). The rule, for every algorithm and
// store: a bucket never holds more after a refund than it would have had the
// refunded cost never been charged, nor more than its burst. A GCRA's charge
// that ended the TAT at end still holds back min(cost × interval, max(0, end −
// now)), which comes off the TAT, never back before now: what has drained
// since (the bucket refilled) may be a later request's. A fixed window gives
// back while the take's window is the current one; a sliding counter takes the
// charge off the take's window's count, or off the previous count once the
// bucket moved on one window; a sliding log drops cost entries of the take's
// time (unlog). Concurrency is left to Release. A refund reads its charge's
// end as the take left it: after a refund of an earlier-queued charge in
// between, it may give back up to what that shift drained of it (at most its
// own cost, never above the burst).
//
// Policy.Charge charges cost whatever the bucket holds, for the algorithms
// with Debt only (others get a zero Decision, as in Redis): the TAT moves on
// at most MaxDebt beyond full, and takes are refused until the debt is repaid
// at the rate.
//
// InstanceShare is a zone's share of its limit on one of n instances
// (on_store_error local's, and a synced zone's while its rounds fail): the
// rate divided by n (a bucket refills n times slower), the burst or slots
// divided by n, at least 1.
//
// # Key digests
//
// Stores keep a digest of a client key, never the key: KeyHash, the first 16
// bytes of its SHA-256; a KeyHasher's, of its HMAC-SHA-256 under key_secret
// (pooled states); ProcessKeyHasher's, two 64-bit maphash sums under seeds
// drawn as the process starts, for handlers whose digests never leave it (no
// Redis, no storage): a collision takes about 2^64 keys, and cannot be aimed
// at without the seeds. Request.WithDigest computes it once per request. ID
// (IDOf: zone, algorithm, digest) keys the memory store's buckets and bans and
// a RefusedCache's entries. Redis keys carry 12 of the 16 bytes
// (limiter/redisstore).
//
// # Numeric bounds
//
// MaxRate (2^40) bounds a rate's count and a burst, exact in a float64 and in
// Lua's doubles. MaxCost (MaxRate + 1) is the largest limit; BoundedCost
// counts a cost above it (a placeholder's may be anything up to math.MaxInt64)
// as MaxCost + 1 and a negative one as 0, before any arithmetic, so a huge
// cost is refused as any cost over the limit and no sum wraps. A rate's period
// is at most 365 days (ParseRate); a policy's period, a ban's durations and
// Burst × Interval at most MaxPeriod (100 years); debt at most MaxDebt (30
// days); counts compare within epsilon (1e-9).
//
// # Invariants
//
// Most are held by package limiter's tests, run against the memory store, a
// standalone Redis and a Cluster alike:
//
//   - Both stores agree: TestTokenBucketBurstThenRefill, TestTokenBucketCost,
//     TestFixedWindow, TestSlidingWindowLog, TestSlidingWindowCounter,
//     TestLeakyBucket, TestConcurrency, TestBoundaryBurst,
//     TestTokenBucketFractionalInterval, TestLeakyBucketFractionalInterval.
//   - A refund undoes its own charge and nothing newer: TestRefund,
//     TestRefundAfterWindowTurned, TestRefundAfterRefill,
//     TestRefundInFlight, TestRefundLogWithoutID, TestRefundNeverGivesMore.
//   - Numbers a client can influence are bounded before arithmetic:
//     TestMaxCost, TestPolicyValidate, TestHugeCost, TestChargeMaxDebt,
//     TestChargeDebt.
//   - A changed policy keeps its bucket, a changed algorithm starts
//     afresh: TestPolicyChangeCarriesTokensOver, TestAlgorithmChange,
//     TestConcurrencyReset.
//   - Digests: TestKeyHasher, TestProcessKeyHasher. Rates:
//     TestParseRate, TestParseRateUnitWords, TestPolicyString.
//   - A late take drops no window's count: TestWindowsLateReading (here).
//
// # Imports
//
// The standard library only (crypto/sha256, crypto/hmac, hash/maphash for the
// digests): bucket is the leaf. Every other package under limiter/ imports
// it, and so does the root package.
package bucket
