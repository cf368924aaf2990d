// Package redisstore keeps rate-limit buckets in Redis (standalone, Sentinel
// or Cluster), so that every instance that shares the Redis enforces one
// limit.
//
// A Store is a limiter.Store whose every decision is one Lua script run per
// algorithm (and, in a cluster, per hash slot): read, compute and write at
// once in Redis, on the server's clock, so that instances whose clocks
// disagree agree on every bucket. The commands bound for one node leave
// together in that node's next pipeline, and those that run the same script
// join into one script call that decides them in turn. Each node has a circuit
// breaker: a node that fails costs its own keys a fallback, not every request
// a timeout. A script that may have run is never sent again.
//
// # Keys
//
// A bucket's key is <prefix>{<tag>}:<zone><suffix>: the tag is the first 12
// bytes of the key's digest in base64url (redisDigestBytes), the suffix the
// algorithm's (keySuffixes). A client cannot choose its slot, keys have one
// length, the raw key is never stored, and the zones of one client share a
// slot. New refuses a prefix with braces. Ban keys add ":b" and ":r"; RedisKey
// is for tools and tests. The map is in ARCHITECTURE.md.
//
// # A decision
//
// scriptRuns groups a call's requests into runs: per algorithm outside a
// cluster, per algorithm and tag in one (a single request takes a pooled
// oneRun). run then: routes each run (in a cluster, the master of its slot by
// go-redis's map, else the cluster client, node ""); asks every node's breaker
// (breakers.admit) unless the mode gives back (release, refund), failing with
// ErrBreakerOpen before anything is sent; builds each EVALSHA (evalCmd, an
// onceCmd, with pre-boxed modes and policy numbers, at most 4,096 policies);
// queues the commands (batcher.do) and waits for the replies or the budget;
// sends again alone, through the client, what certainly did not run (MOVED,
// ASK, errBatchElsewhere; NOSCRIPT as EVAL), counting the first node as
// answered; and records each node's outcome (breakers.record). take decodes
// the replies; when one run refused and others charged, it refunds those in a
// second round trip, each at its take's time (the time given, else its
// reply's, its node's clock) with each key's take as flag (takenFlag), under a
// budget as long as the take's (refundContext): a failure there returns the
// decisions with a *RefundError, the tokens staying taken. After an error that
// is not a Redis reply, a cluster client reloads its slot map
// (reloadTopology). TakeWithin decides under a budget (a pooled context with a
// deadline, no timer, never canceled): a client that leaves cuts no call
// short. Release and Renew run the concurrency script's modes of those names,
// Peek a take of cost 0 and no ID in peek mode, Refund and Charge (and their
// ...At) the refund and charge modes; Reset DELs the bucket and ban keys.
//
// # Scripts
//
// luascripts assembles each algorithm's script: common.lua, gcra.lua for the
// token and leaky buckets, then the algorithm's file (scripts). A run is
// EVALSHA <sha> <nkeys> <keys> <now> <mode> and six arguments per key: rate,
// period in µs (the lease for concurrency), burst, cost, flag and ID. now is
// "" for the server's TIME, or a time in µs (TakeAt and the other ...At, and
// the refund of a refused request). The flag is the leaky bucket's nodelay
// (1), a synced window's carry (2: what its charges put past the limit weighs
// on the next window), or in a refund its take's "<at>:<end>". A batched call
// adds the number of keys of each request. The reply is integers only: the
// time, then per request all allowed (1/0; in a batch -1 WRONGTYPE, -2 another
// script error, -3 keys not the node's) and five integers per key. common.lua
// documents both.
//
// # Automatic pipelining
//
// batcher keeps a queue and a flusher goroutine per node ("" outside a
// cluster, and the cluster client's own queue). With no batch in flight, a
// command leaves at once; while one is, commands queue, and the next batch
// takes them all, at most maxBatch (256). There is no timer. A queue holds at
// most maxQueued (65,536) commands, past which calls fail with errQueueFull; a
// command whose caller's time was up before its batch left is not sent
// (errNotSent). A batch runs under its commands' latest deadline and no
// caller's cancellation; each command gets its own reply or error. A node
// whose client go-redis replaced gets a new queue, and a decision that finds
// its queue closed by forgetGone goes on the new one.
//
// # Batched script calls
//
// In a batch, the commands of one script, mode and time argument join into one
// call (joiner.go), each all or nothing on its own and each seeing what the
// previous wrote. joinAny (standalone, Sentinel) joins adjacent commands;
// joinByNode (a cluster master's queue) any of the batch, of any slot;
// joinByTag (the cluster client's queue) those of one tag; joinNone (other
// clients, a ring) none. No command passes an earlier one of its slot; a call
// weighs at most maxJoinWeight (64: a key each, a sliding log's cost). A call
// of several slots declares no keys (Redis lets a script without flags use
// undeclared keys of the node); a request of it whose keys are not the node's
// gets -3 when it did nothing that would count twice (common.lua's dirty) and
// is sent again alone. A call that finds no script is sent again as EVAL by
// the flusher, in order, in one pipeline (evalAgain). Two cases keep no order
// and err toward refusing: a script loaded by another connection while a batch
// runs, and commands sent again after MOVED, ASK or -3, each from its caller.
//
// # Failures
//
// Unavailable says which errors count toward a breaker: no reply, a deadline,
// an open breaker, a full queue, a reply starting LOADING, CLUSTERDOWN,
// MASTERDOWN, TRYAGAIN, READONLY, BUSY, OOM, NOREPLICAS, MISCONF or "ERR max
// number of clients", and refused credentials (AuthFailed: NOAUTH, WRONGPASS,
// NOPERM, an unauthenticated protocol error). A canceled context (the caller
// left), a malformed reply (errReply) and any other Redis error (a script
// error of one request's data) do not. A Breaker opens after BreakerFailures
// (3) consecutive failures for BreakerCooldown (2 s), then lets one call at a
// time probe; give-backs record only their successes. OnBreaker hears of each
// opening and closing. Every minute a cluster store forgets the nodes absent
// from two slot maps in a row, with their queues and breakers (forgetGone;
// OnForget hears of each). A call never sent fails with a bucket.NotRunError
// (ErrBreakerOpen, a full queue, its time up in the queue), so that
// bucket.MayHaveRun tells a failed decision that may have taken slots.
//
// # Bans and sync
//
// ban.lua counts refusals and bans, on the ban keys. Banned pipelines its
// checks (client.Pipelined; EVAL on NOSCRIPT) and Refused runs it through
// go-redis's Script.Run: neither goes through the batcher, the breakers or
// onceCmd (the limiter reads bans from memory while a breaker is open), and in
// a cluster go-redis may count a refusal twice. For limiter/fleetsync the
// Store is a Fleet: ChargeAll charges a round (cost 0: a reading), Groups
// splits it by node in parts of at most 500, RegisterSync and CountSync
// register and count the instances on Redis's clock (sync_register.lua,
// sync_count.lua).
//
// # Invariants
//
//   - A script that may have run is never sent again (but ban.lua in a
//     cluster): TestScriptRunsOnceInCluster, TestBatchedCallMigrating.
//   - No command passes an earlier one of its slot: TestJoinKeepsOrder,
//     TestNoScriptKeepsOrder.
//   - Exact, a batched call deciding in turn: TestRedisConcurrentExact,
//     TestBatchedCalls, TestBatchedCallsAcrossSlots, TestBatchedCallArgs.
//   - Only unavailability counts toward a breaker; a request's error is
//     its own: TestUnavailable, TestAuthErrorsAreUnavailability,
//     TestScriptErrorKeepsBreakerClosed, TestBatchFailsEachOnItsOwn.
//   - Failure stays on its node; every call that starts is recorded by its
//     breaker: TestNodeBreakers, TestProbeOfAnAnsweringNodeIsRecorded,
//     TestTimeoutRaceNeverPanics, TestBatcherCallerTimesOut.
//   - Give-backs ignore breakers: TestRefundWhileBreakerOpen,
//     TestFailedReleasesDoNotDelayProbes.
//   - A refund undoes its own charge and nothing newer, on its bucket's
//     node's clock: TestRedisRefundKeepsNewerState, TestRedisRefundHugeCost.
//   - Keys are digests of one length, with a TTL to the initial state:
//     TestRedisKeysHashed, TestRedisTTL, and in package limiter
//     FuzzRedisKey, TestRedisKeyFlood.
//   - Batches and calls stay small: TestAutoPipelining, TestJoinBounded,
//     TestJoinModes; lost scripts and moved slots are sent again once:
//     TestBatchedCallNoScript, TestRedisScriptFlush,
//     TestRedisClusterFailover, TestBatchedCallElsewhere.
//   - A synced window carries its overshoot one window: TestSyncWindowCarries.
//
// TestRedisFootprint and TestRedisMemoryPerKey measure the memory per key
// (figures in BENCHMARKS.md).
//
// # Imports
//
// limiter/bucket (requests, decisions, policies), luascripts (the scripts) and
// go-redis, whose client Dial makes of plain Options (dial.go). Only package
// limiter imports it: the root package reaches Redis through limiter.New.
package redisstore
