// Package luascripts holds the Redis Lua scripts of the Redis store,
// embedded in the binary: one per algorithm, each with common.lua in front
// of it. common.lua reads the arguments and builds the reply, the same for
// every algorithm (it documents both); an algorithm's script only decides
// one key and writes its state. regional.lua, after it for the token
// bucket and the quota (the algorithms a global zone may have) and for
// the leaky bucket (gcra.lua reads a value through it), reads and keeps
// what a global zone's key holds beside its state (see package
// limiter/regions).
// gcra.lua, between them for the token and leaky buckets, keeps their
// state: one integer, GCRA's theoretical arrival time. ban.lua, the
// bans' script, stands alone.
package luascripts

import _ "embed"

var (
	//go:embed common.lua
	common string
	//go:embed gcra.lua
	gcra string
	//go:embed regional.lua
	regional string
	//go:embed token_bucket.lua
	tokenBucket string
	//go:embed fixed_window.lua
	fixedWindow string
	//go:embed sliding_window_log.lua
	slidingWindowLog string
	//go:embed sliding_window_counter.lua
	slidingWindowCounter string
	//go:embed leaky_bucket.lua
	leakyBucket string
	//go:embed concurrency.lua
	concurrency string
	//go:embed quota.lua
	quota string
)

// The scripts, by algorithm, and the bans' script.
var (
	TokenBucket          = common + regional + gcra + tokenBucket
	FixedWindow          = common + fixedWindow
	SlidingWindowLog     = common + slidingWindowLog
	SlidingWindowCounter = common + slidingWindowCounter
	LeakyBucket          = common + regional + gcra + leakyBucket
	Concurrency          = common + concurrency
	Quota                = common + regional + quota

	//go:embed ban.lua
	Ban string
)

//go:embed overrides_stamp.lua
var overridesStamp string

//go:embed overrides_write.lua
var overridesWrite string

//go:embed overrides_restore.lua
var overridesRestore string

// OverridesWrite is the overrides' script (see limiter/overrides): it
// writes a change of an override (or its tombstone) unless a later one is
// held, drops the expired ones, moves the version on and announces the
// change.
var OverridesWrite = overridesStamp + overridesWrite

// OverridesRead reads the overrides' entries (a page of them, or those
// named), leaving out those too long to be an override's.
//
//go:embed overrides_read.lua
var OverridesRead string

// OverridesRestore writes back, entry by entry, the changes of overrides
// an instance holds that Redis lacks or holds earlier ones of.
var OverridesRestore = overridesStamp + overridesRestore

// SyncCount counts the instances that sync, registering nothing; SyncRegister
// registers one and counts them (see limiter/redisstore's package doc).
var (
	//go:embed sync_count.lua
	SyncCount string
	//go:embed sync_register.lua
	SyncRegister string
)
