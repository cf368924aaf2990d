// Package limiter decides whether an HTTP request may pass the rate limits of
// its zones. It knows nothing of Caddy or HTTP.
//
// A Limiter decides against one store, which New makes of a Config: this
// process's memory (the zero Config), Redis (Config.Redis: with a breaker per
// node, a cache of the clients Redis refused, and memory to fall back on; with
// Config.Regions, the exchange of the global zones with the other regions), or
// a storage that the instances of its zones that sync share (Config.Storage:
// the other zones in memory). It keeps the zones' run-time overrides where it
// keeps the buckets (Overrides). Its users need no other package of this
// module but limiter/bucket's types, which it aliases, and limiter/overrides:
// New dials Redis (limiter/redisstore's Dial, from plain RedisOptions) and the
// peer regions, and every component it builds is reached through its methods
// (TestRootImports holds the Caddy module to that). Other Go programs may
// import it, without a promise of a stable API across this module's versions:
// the Caddy module's configuration is the product's interface.
//
// A request is a set of Requests, one per zone (limiter/bucket): Decide gives
// a Verdict with a State and a Decision per zone, all or nothing: when one
// zone refuses, no zone is charged. Dry-run zones (Request.DryRun) are decided
// in a call of their own, before the enforced ones, charged as any, and never
// refuse: their refusal is WouldRefuse. Each caller brings a Caller: its
// on_store_error (Fallback) and its Events, so that failures and bans are told
// to the handler that met them; a Limiter keeps no metrics. Time is a
// parameter: the clock of memory decisions, of the cache and of bans; Redis
// decides on its server's clock. One Limiter serves every handler that shares
// its store, safe for concurrent use.
//
// # Deciding
//
// For each part (dry-run, then enforced; decideApart when they are
// interleaved), Decide:
//
//  1. refuses the whole part when a request is blocked (Request.Block, an
//     override): a Banned decision with the block's time, nothing charged;
//  2. for enforced zones that ban, looks up the bans (skipping clients the
//     RefusedCache refuses already) and refuses with the longest ban;
//  3. takes: zones that sync from this instance's allowances first
//     (limiter/fleetsync's Syncer.Take), then the exact zones and the
//     synced buckets the Syncer leaves to Redis in one call, a refusal
//     there giving the allowances back, and Redis's answers seeding the
//     Syncer (Syncer.Seed); other zones in memory (one clock reading) or in
//     Redis, unless the RefusedCache answers;
//  4. when Redis fails, lets the Fallback decide: FallbackLocal in memory,
//     each limit divided by Fallback.Instances (bucket.InstanceShare);
//     FallbackAllow (Unlimited) or FallbackDeny (Denied);
//  5. holds the concurrency slots of an allowed request (Verdict.Release);
//  6. counts the enforced refusals of zones that ban (BanStarted when one
//     starts a ban, whose refusal the RefusedCache keeps: PutBan).
//
// A Redis take runs under a budget of the timeout, on no context the client
// can cancel (redisstore's TakeWithin). An unavailable store
// (redisstore.Unavailable) is a StoreUnavailable failure, reported once per
// node until a request to that node succeeds (StoreFailing, StoreRecovered; a
// forgotten node is dropped): while none fails, a success costs one atomic
// load. Any other error is ScriptFailed, that request's alone, reported loudly
// at most every ScriptErrorReportEvery. A take that may have run before it
// failed (bucket.MayHaveRun), and a refused request whose refund failed
// (redisstore.RefundError: refused anyway, its tokens staying taken), release
// their slots in the background.
//
// # The stores
//
// Store is what a Limiter asks of a store: Take (all or nothing, distinct
// buckets), Release, Refund, Charge, Peek, Reset, Banned, Refused, Close.
// limiter/memstore's Store and limiter/redisstore's Store implement it. The
// bucket types are aliased here (Request, Decision, Policy, Ban, Algorithm,
// KeyHasher, and the algorithms) for the root package.
//
// # Concurrency slots
//
// holdSlots returns the release of an allowed request's slots; nil when a zone
// refused (a refusal took nothing). In Redis a slot is a lease: renewLeases
// renews the leases held every third of the shortest lease until the release
// (a lease that expired or was reset is not made again). releaseSlots gives
// back under the timeout, whatever the breakers say; a Redis release that
// fails goes to releaseRetries: one goroutine per Redis Limiter, a queue of at
// most 10,000, rounds 250 ms apart, each grouping the releases by node in
// calls of at most 16 (releaseChunk), all at once, so that a silent node holds
// back only its own; a release whose lease has expired is dropped.
//
// # The cache of refused clients
//
// RefusedCache maps a bucket (bucket.ID) to its refusal, the policy and the cost
// it was refused at. Get answers the same policy at an equal or higher cost,
// until the client could pass and at most MaxAge
// (RedisOptions.LocalCacheMaxAge), so that a reset on another instance reaches
// this one. Put keeps no concurrency refusal (a slot may free at any time) and
// none of a policy that bans (each refusal counts toward the ban); PutBan
// keeps a ban's. Full, it drops expired entries and others at random until a
// tenth is free. Reset deletes the client's entry here.
//
// # Bans
//
// A ban lives in the store that decides the client: Redis while the breakers
// of its keys' nodes are closed (bans are the fleet's), else this process's
// memory (banStore). BanLeft tells it for the admin API.
//
// # Settling, peeking, resetting
//
// Settle refunds and charges the requests of settled responses in one timeout
// (Store.Refund with each take's Decision, Store.Charge). Peek reads a bucket
// (a storage fleet's view for a synced zone); Reset drops a bucket and its
// client's ban. These, ban lookups, refusal counting, releases and renewals
// wait at most the Limiter's timeout (RedisOptions.Timeout, 1 s by default and
// for memory), on contexts detached from the client's; release retries wait at
// least a second.
//
// # Zones that sync
//
// New builds a fleetsync.Syncer on the fleet of a Redis or a storage Config
// (the Redis store, or a fleetsync.StorageFleet), telling Config.Sync of its
// rounds; Instances, SyncReady and CountSync expose it, and Close stops it after its last round,
// before the storage fleet's last write.
//
// # Invariants
//
// The tests here run the same timed tables against the memory store, a
// standalone Redis and a Cluster (testStores): the conformance suite of
// limiter/bucket's algorithms in both stores.
//
//   - A refused request takes no token from any zone: TestAllOrNothing,
//     TestMixedAlgorithmsAllOrNothing, TestFailedRunGivesBack.
//   - Dry-run zones never hold back the enforced ones; a block charges
//     nothing: TestDecideDryRun, TestBlockedRequest.
//   - A failure is reported once per node: TestFailureReportedOncePerNode.
//   - What was taken is given back on every path: TestRefusalHoldsNoSlots,
//     TestReleaseRetriesChunked, and in the root package
//     TestReleaseWhileBreakerOpen, TestReleaseRetriesPerNode,
//     TestLeaseRenewed, TestRefusedRenewsNoLeases.
//   - A caller that leaves cuts no call short, and a client's script error
//     is its own: TestBreakerProbeOfALeavingClient,
//     TestScriptErrorsStayWithTheirClient (root package).
//   - The cache of refused clients is exact: TestRefusedCache,
//     TestRefusedCacheBounded, TestHotKeyRefusedLocally (internal/e2e).
//   - Bans hold across instances: TestBans, TestBanSurvivesAcrossInstances
//     (internal/e2e). Decisions use the store's clock: TestClockSkew (root).
//   - Both stores agree: TestTokenBucketBurstThenRefill, TestFixedWindow,
//     TestSlidingWindowLog, TestSlidingWindowCounter, TestLeakyBucket,
//     TestConcurrency, TestPeekAndReset, TestHugeCost, TestAlgorithmChange.
//
// # Imports
//
// limiter/bucket, limiter/memstore, limiter/redisstore and limiter/fleetsync;
// never go-redis (redisstore.Client names its client), Caddy, net/http or the
// root package, which imports this one.
package limiter
