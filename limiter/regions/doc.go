// Package regions holds a zone's limit across regions (a zone that is
// global): each region decides its requests from its own Redis alone, and
// tells the other regions what it admitted in the background, every
// interval, by charging their Redis.
//
// # The model
//
// Each region keeps, in its own Redis, a copy of each client's bucket of
// a global zone: a token bucket of the zone's rate and burst. A region's
// requests are decided against its copy (exactly, or with sync), and
// what they admit is charged at once there; what the other regions
// admitted is charged there too, by them, at most D later, into debt if
// need be. So every copy is charged what the whole world admitted, and
// refills at the zone's rate.
//
// What a region spends that the others have not been charged yet is
// bounded (decide_whole in token_bucket.lua): its own admissions of the
// last D (counted in quarters of D, so of D to 1.25 D) stay within its
// share of the room its copy shows the others left, and of what refills
// in 2D: (burst − (spent − own recent)) / R + rate × 2D / R. So the
// regions together never spend unseen more than the room there was and
// the refill, whatever the mix of their requests. Once the room is spent,
// a region admits at most 2 × rate × D / (R − 1) over the D to 1.25 D it
// counts: among 3 regions, from 0.8 of the whole rate to all of it. So a
// client whose requests come mostly through one region gets the rate the
// others leave it (with
// 3 regions, 90/10 at twice the limit, 97 % of the exact admissions;
// TestRegionsAccuracy); among more regions, that region's part of the
// rate is smaller. A region holds the whole
// burst, unbounded by that share, while no other region asks for the
// key: it has been asking for it for at least D (a region that asked at
// the same time has charged it since), and no peer has charged it for 2D.
// A region that starts asking meanwhile spends its part at once; the
// holder hears of it within D and stops holding. So a client of one
// region gets its whole burst there, from D after its first request (a
// region keeps a key's record 10 minutes after its last request or
// charge). A key another region asked for too, while the record was
// kept, holds again after a pause of more than D only once its region
// has been asking for D anew (see resumed in regional.lua): both regions
// may come back to it at once, each unheard by the other for 2D, and
// would both hold. Such a client, after a pause, gets its share at once
// and the rest D later; a request that costs more than the share waits
// until its region has been asking for D (its retries within D of each
// other). Tag carries R and D to the script.
//
// An Exchange is one instance's part of it: Record counts what this
// instance admitted in global zones, by bucket; every interval, from a
// random phase of the instance's own (instances started together would
// otherwise charge a peer's Redis at one instant, and its region's
// requests wait behind all of it), the counts are handed to each peer
// region's sender, which charges them to the
// peer's Redis (Peer.ChargeAll, batched by node) and, at once, marks this
// region there (Peer.MarkRegion, expiring after LinkTimeout, with this
// region's Fingerprint: see fingerprint.go): one round
// trip. Before its first exchange a sender prepares the peer
// (Peer.Prepare: connections, scripts loaded). A part that fails, having
// run or not (a time-out, a reset), puts its buckets in doubt: they are
// charged again at the next exchanges, each by its total since the last
// charge known to have run, and the peer applies what of a total it has
// not applied yet, so that each admission is charged exactly once
// (charges.go). A peer that is slow or down holds only its own sender:
// requests never wait on a peer, and the counts for it wait in its
// backlog (at most maxBacklog buckets, with those in doubt). An exchange
// is paced so that the peer's Redis serves its own clients between its
// calls (charges.go); a flood of distinct keys beyond what an instance
// keeps counts of, or can tell, makes it decide with its share (flood.go).
//
// # Levels
//
// Every copy of a bucket is charged what every region admits, so copies
// that differ (a region's copy more spent: charges dropped while a link
// was down, a zone global in one region before the others, debt) stay
// apart, and the region whose copy is more spent is starved for good by
// the others keeping theirs at the brink. So a region tells its level:
// when a bucket refuses a request, Refused counts, beside the bucket's
// charge, when the region's copy was empty (the time token_bucket.lua
// stores: policy-free, so a region deciding with its share and one with
// the whole rate compare), and the next exchange sends it, in µs from when
// the peer runs the charge, after the charge's id (withLevels); the peer
// lifts its copy to it if it holds more (gcra.lua). A copy only ever rises
// (the bound holds), and the copies converge to the most spent within an
// exchange, less the error of the time the charge takes to reach the peer
// (half the last charges' round trip is subtracted): what the copies still
// differ by is far less than what a region admits unseen in an exchange,
// and the regions take turns. Only refusals send levels: a copy less spent
// admits, and is lifted by the refusals of the others.
//
// A region that decides alone (one region counted, below) decides on its
// own time: each bucket keeps, beside the world's time, the TAT of the
// region's own admissions at its share's rate (Tag marks a take "A<R>";
// see token_bucket.lua). What the others still charge it (the regions it
// still reaches) does not count against its share: each region cut off,
// or cutting itself off, admits rate / R, and so the regions still linked
// together admit what the cut one does not. Its admissions move the
// world's time on too, at the whole rate's interval, and never leave it
// emptier than the own time, so that the rate coming back admits no
// burst; a region with the whole rate ("G<R>") moves its own time on, never
// into debt, so that one cut off starts alone from what it spent.
//
// A region whose own Redis fails decides with on_store_error; local
// decides a global zone with the region's share of the rate too (Caller,
// in package limiter): the others are charged what it admits, and keep
// the rest.
//
// A ban started by a global zone (Banned) is told to every peer at the
// next exchange (Peer.Ban: the ban set there for what is left of it,
// unless a longer one is in place); one that fails is told again, until
// the link is down.
//
// # The bound
//
// While every exchange succeeds, an admission reaches every other region
// within D = interval + timeout. Over any period, the world then admits at
// most what the exact limit admits over that period, plus
//
//	(R − 1) × ⌈burst/R⌉ + 2 × rate × D
//
// (the regions spend unseen at most the room there was and what refills
// in 2D; and while one region holds the whole burst, each other that
// starts asking for the key spends its share of the room before the
// holder hears of it: see Bound, logged as a config loads). With 1000r/m,
// burst 1000, 3 regions, interval 1s and timeout 1s (a peer's default):
// 2 × 334 + 2 × 16.7 × 2 ≈ 735; without the holds, 67.
// What a region admitted beyond it is charged as debt in every region: it
// is carried, not forgotten at a window's turn, so over a long period the
// world's rate is exact.
//
// # Failure
//
// A link to a peer is down once no exchange with it succeeded for
// LinkTimeout (two intervals and two timeouts), or while it is degraded
// (3 of its last 10 exchanges failed: health.go); the Exchange reports it
// once (Events.LinkChanged) and once more when it is up again. A degraded
// link stops marking this region in the peer, and, once the last mark has
// expired there (LinkTimeout), charges it nothing and pings it instead:
// both regions then decide with their shares, as cut off from each other.
// A peer is heard while its mark is in this region's Redis. Each
// interval the Exchange counts the regions admitting up to the rate
// (Links): every region while this one's link to each peer is up and each
// peer is heard, else this one alone. A region decides with the rate of
// those counted, k × rate / R (its buckets' period stretched R / k
// times): the whole rate, or its own share. Counting any fewer than all
// is unsound: a peer cut off from this region only may still count
// itself with the others, and admit its share and more unseen here
// (TestRegionsOneLinkCut). An instance starts alone, and counts the
// others once an exchange with each has succeeded and each is heard: one
// that starts during a partition never takes a cut region's rate
// (TestRegionsStartDuringPartition); a fleet that starts together decides
// with its shares for an interval or two. A mark missing while the
// instance starts (for LinkTimeout) is not reported. A sender marks its region in a peer only while its charges
// there succeed. What it could not send a peer whose link is down is
// dropped, not sent when the link heals (the peer counted this region at
// its share meanwhile); bans wait, and are told when it heals. Links and
// marks are reported once as they fail and once as they heal
// (Events.LinkChanged, Events.Heard). What on_store_error allow let
// through is not recorded, and a bucket's charge to a peer is at most
// twice what the instance can have admitted since its last exchange
// (maxCharge). Close hands out the last counts and makes a last exchange.
//
// A rate that comes back when a link heals does not fill a bucket: a token
// bucket's period shortening can only lower what it holds, so healing
// admits no burst. Each link failure may add once, before it is seen, what
// a region admits unseen until then: at most ⌈burst/R⌉ + rate ×
// (LinkTimeout + interval) per region cut off.
//
// # Quotas
//
// A global quota (a calendar quota: bucket.Quota) is held the same way,
// with a count per period instead of a time (see quota.lua). Each copy
// counts, in the period that holds its Redis's clock, what its region
// admitted and what the others charged it; a charge names the end of the
// period its admissions counted in (RecordPeriod, from the decision's
// Reset; "@<end>" after its id), and counts in no other: a count of a
// period that turned before it arrived went with that period, and a new
// period starts whole. A count in doubt of a period that turned is
// charged anew, in the new period's own epoch (charges.go). With every
// region counted (TagQuota: "G<R>:<D>"), a region admits within the
// quota's count and, unless it holds the whole quota (as a token bucket
// holds its burst), its own admissions of the last D within its share of
// what the others left, ⌈(quota − (count − own recent)) / R⌉; a refusal
// by that share, while the count has room, says to ask again when the
// quarter of D turns. Alone ("A<R>:<D>", any region not counted), it
// admits at most ⌈quota / R⌉ of the period, what it admitted with every
// region counted included, and within the count. A refusal's level is
// the region's count, and a peer lifts its copy to it (counts only rise,
// and no copy counts more than the world admitted, so the bound holds).
// The bound is (R − 1) × ⌈quota / R⌉ in each period: the regions spend
// unseen at most what the period had left, and a share for each region
// that starts asking while one holds. on_store_error local decides with
// the region's share of the quota. A quota's key keeps its region's own
// record to the period's end and 10 minutes past its last request.
//
// # Invariants
//
//   - Requests never wait on a peer: Record and Policy take a mutex and
//     no I/O (TestRegionsCutOff, TestRegionsEndToEnd: no decision waits
//     on a cut-off peer).
//   - Bound, the share of the burst and the rate of the regions counted
//     as stated (TestBound, TestPolicyShare); Record counts only what a
//     global zone admitted, not in dry run (TestRecord).
//   - Regions together stay within Bound (TestRegionsBound; end to end,
//     TestRegionsEndToEnd in internal/e2e).
//   - A cut-off region decides with its share, and healing admits no burst
//     (TestRegionsCutOff; end to end, TestRegionsEndToEnd); one link cut
//     keeps the bound too (TestRegionsOneLinkCut).
//   - A client of one region gets the exact limit's whole burst, and a
//     client that moves is admitted again, within the bound
//     (TestRegionsOneRegionBurst, TestRegionsMovingClient); the rules
//     of the hold and the wait (TestRegionalHold in limiter/redisstore);
//     two regions that come back to a client at once hold nothing
//     (TestRegionalBothResume, TestRegionalQuotaBothResume), and a
//     client of one region alone keeps its hold across pauses
//     (TestRegionalLoneClientCostly, TestRegionalLoneClientBursts).
//   - Copies of a bucket apart by 40 tokens converge, and no region
//     starves (TestRegionsCopiesConverge); with a region's Redis stopped,
//     on_store_error local keeps it to its share and the others admit
//     (TestRegionsHomeDown); a level lifts a copy less spent, never one
//     more spent (TestChargeOnce in limiter/redisstore).
//   - A ban of a global zone reaches every region; another zone's does
//     not (TestRegionsBanGlobal).
//   - A charge in doubt is charged again until it is known to have run,
//     and runs once (TestChargesInDoubtRunOnce; in Redis, TestChargeOnce
//     in limiter/redisstore); over links that fail 200 ms of every 500 ms
//     the regions stay within Bound (TestRegionsLossyLinks); a link is
//     degraded and healed as stated (TestHealth).
//   - A million keys in an interval: the peer's Redis serves its other
//     clients within 25 ms, every admission is charged or counted
//     dropped, the instance floods and recovers (TestExchangeFlood); a
//     bucket counted takes at most 120 bytes (TestPendingMemory).
//   - A global quota: each charge counts once and in its own period
//     (TestChargesInDoubtRunOnce, TestRecordPeriod; in Redis,
//     TestRegionalQuota and TestRegionalQuotaAlone in
//     limiter/redisstore); 240 clients in four shapes through three
//     regions stay within the bound, refusing under 3 % of what the exact
//     quota admits with the links up (TestRegionsQuota; end to end,
//     TestRegionsEndToEnd in internal/e2e).
//   - Regions whose fingerprints differ (fingerprint.go) decide with their
//     shares, charge each other nothing, say what differs once, and stay
//     within Bound (TestRegionsDifferentSecrets, TestRegionsDifferentLimits,
//     TestFingerprintDiffers; end to end, TestRegionsKeySecretDiffers).
//
// # Imports
//
// limiter/bucket (requests, policies, MayHaveRun) and limiter/overrides
// (the writers of the copies); no go-redis: a peer's Redis is a Peer that
// package limiter dials and hands it (a redisstore.Store).
package regions
