// Command fleetsim runs a fleet of rate limiters in one process against
// real Redis, and prints one line of what the run cost and how far its
// decisions were from the exact limit's.
//
// # The model
//
// A fleet is N instances, each a limiter.New of its own, as separate
// Caddys would have them: its own Redis clients, its own syncer of the
// zones that sync, its own exchange with the other regions. Nothing is
// shared between them but Redis. The instances are spread over R regions,
// instance i in region i mod R, each region deciding from its own Redis
// (a standalone server or a Cluster; -redis).
//
// One zone, a token bucket of -rate and -burst, is decided by the fleet in
// one of three modes (-mode):
//
//   - exact: every request in Redis (Request.Sync 0);
//   - sync: from each instance's allowance, synced with Redis every -sync
//     (package limiter/fleetsync);
//   - regions: a global zone (Request.Global), decided exactly in each
//     region's Redis (each spending unseen its part), the regions
//     telling each other what they admitted every -exchange (package
//     limiter/regions).
//
// The clients are -keys keys, their popularity Zipf's of exponent -zipf:
// key k (0-based) sends a share of the requests in proportion to
// 1/(k+1)^s, s 0 being uniform. So a few keys send far beyond their limit,
// some near it, and the long tail far under it; the line tells how the
// requests split (load=). -workers goroutines send the requests, each to
// an instance picked at random (a load balancer that spreads every client
// over the fleet): as fast as the fleet decides (closed loop), or at -qps
// in all (open loop, paced per worker). In a closed loop of -zipf 1, the
// keys over their limit send most of the requests, and in mode exact the
// cache of refused clients answers most of those without Redis: the
// figures are then mostly a refusal's; -qps, a smaller -zipf or a higher
// -rate set another mix. The CPU per decision of both the gateway and
// Redis grows as the load falls (fewer calls share a wake-up): compare
// runs at the same -qps.
//
// # What is measured
//
// Setup (the instances made, warm: in sync every instance registered twice
// and counting the others; in regions every instance counting every
// region) is timed apart, then the load runs for -warmup, then for
// -duration, the measured window:
//
//   - decisions/s: decisions made in the window, by its length;
//   - gw_us: this process's CPU (getrusage: user + system, every thread:
//     the decisions, the syncers' rounds, the exchanges, the Redis
//     clients) in the window, by decisions, less the load generator's own
//     cost (gen_us: after the run, the fleet closed, the workers run for
//     up to a second as they did, paced when they were, drawing keys and
//     instances and recording, but asking no decision); the digest of
//     each key is counted in gw_us, as Caddy computes it per request. At
//     a low -qps, gw_us also counts what runs whatever the load (the
//     syncers' rounds, the exchanges, the Go runtime's timers and idle
//     threads): per decision, it grows as the load falls;
//   - redis_us: INFO cpu's used_cpu_sys + used_cpu_user of every node of
//     every region (masters and replicas) in the window, by decisions;
//     redis_idle is the same nodes' CPU per second for a second before the
//     fleet is made (their cron, a Cluster's bus), which redis_us divides
//     too: it weighs at a low load;
//   - redis_B/key: INFO memory's used_memory less mem_clients_normal and
//     mem_clients_slaves (the clients' and the replicas' buffers, which
//     grow with connections and the write load, not keys), added up
//     over the masters, from before the fleet is made to the sample of the
//     load (every second, and at its end) when the masters held the most
//     keys, by the growth of DBSIZE over the masters then (keys_peak: a
//     bucket full again expires, so the end may hold far fewer); "-"
//     under 10,000 keys, where Redis's own noise (its Lua heap, its hash
//     tables, its cluster links: tens of kB a node) outweighs them;
//     key_usage_B is the mean MEMORY USAGE of up to 100 of the run's keys
//     per master at the end (a key's own bytes, without the hash tables);
//   - the accuracy: every decision is recorded (key, time, admitted) and
//     the same arrivals are replayed, per key in time order, through one
//     token bucket of the zone's whole rate and burst (bucket.Policy.Take,
//     the memory store's arithmetic): the exact limit. A decision's time is
//     its Decision.At (Redis's clock for a Redis decision, this process's
//     for an allowance), else the time it returned. For each key,
//     over = the fleet's admissions − the replay's. over_max is the largest,
//     bound the stated bound of the mode (exact: 0; sync: rate × sync +
//     (N − 1)/N × (burst + rate × sync), rounded up, as
//     limiter/fleetsync's doc states it and the Caddy module logs it;
//     regions: Limiter.RegionBound, (R − 1) × ⌈burst/R⌉ + 2 × rate ×
//     (exchange + timeout)), keys_over_bound the keys whose over exceeds
//     it, over_sum the sum of the positive overs as a share of the replay's
//     admissions;
//   - refused_within: of the requests of the clients the replay admitted
//     wholly (within their limit), the share the fleet refused;
//     refused_beyond: the sum over the keys of what the replay admitted
//     beyond the fleet, as a share of all requests (as
//     limiter/fleetsync's accuracy test counts it);
//   - load: the requests of keys under half of what the exact limit admits
//     over the run (burst + rate × run), near it (half to twice), and over.
//
// lat_us is the decisions' time, from Decide's call to its return (every
// decision's, the warm-up's too): p50/p99/p99.9/max in µs; lat_over_ppm,
// how many decisions in a million took longer than 10, 25, 50, 100 and
// 250 ms: those a Redis timeout of that length would have failed, on
// this host under this load (run with a -timeout above them to see the
// whole tail).
//
// fallback counts the decisions the store did not make (on_store_error
// local decided them), errors the store's failures and failed scripts,
// rounds the syncers' rounds (ok/failed), exchanges the regions' (ok/
// failed); a run with failures measures them, not the mode.
//
// Every key of a run starts with a prefix of its own (fleetsim<random>:),
// which is deleted from every master after the run (-keep keeps it). The
// Redis must be the run's alone: another client's commands count in
// redis_us and redis_B/key.
//
// # Usage
//
//	go build -o /tmp/fs/redisfleet ./internal/redistest/redisfleet
//	/tmp/fs/redisfleet -env /tmp/fs/redis.env -dir /tmp/fs/data &
//	source /tmp/fs/redis.env
//	go run ./bench/fleetsim -mode exact -instances 3 -keys 10000 -redis $RL_REDIS_STANDALONE
//	go run ./bench/fleetsim -mode sync -instances 10 -keys 100000 -rate 10r/s -burst 20 -redis cluster:$RL_REDIS_CLUSTER
//	go run ./bench/fleetsim -mode regions -instances 6 \
//	    -redis "eu=127.0.0.1:7000;us=127.0.0.1:7001;ap=cluster:$RL_REDIS_CLUSTER"
//
// -redis names the regions' Redis, separated by ';': each
// [name=][cluster:]address[,address...], a Cluster when it says cluster:
// or lists more than one address (its seeds; every node is found by
// CLUSTER NODES). Unnamed regions are r1, r2, ... One region is a plain
// address list. -regions takes the first R of them (default: all); modes
// exact and sync take one. Without -redis, $RL_REDIS_STANDALONE.
// Progress goes to stderr, the line to stdout.
package main
