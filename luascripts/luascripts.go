// Package luascripts holds the Redis Lua scripts of the Redis store,
// embedded in the binary: one per algorithm, each with clock.lua in front
// of it. Each takes the same arguments and returns the same reply; see
// token_bucket.lua.
package luascripts

import _ "embed"

var (
	//go:embed clock.lua
	clock string
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
)

// The scripts, by algorithm, and the bans' script.
var (
	TokenBucket          = clock + tokenBucket
	FixedWindow          = clock + fixedWindow
	SlidingWindowLog     = clock + slidingWindowLog
	SlidingWindowCounter = clock + slidingWindowCounter
	LeakyBucket          = clock + leakyBucket
	Concurrency          = clock + concurrency

	//go:embed ban.lua
	Ban string
)
