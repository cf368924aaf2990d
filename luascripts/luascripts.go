// Package luascripts holds the Redis Lua scripts of the Redis store,
// embedded in the binary: one per algorithm. Each takes the same
// arguments and returns the same reply; see token_bucket.lua.
package luascripts

import _ "embed"

// The scripts, by algorithm.
var (
	//go:embed token_bucket.lua
	TokenBucket string
	//go:embed fixed_window.lua
	FixedWindow string
	//go:embed sliding_window_log.lua
	SlidingWindowLog string
	//go:embed sliding_window_counter.lua
	SlidingWindowCounter string
	//go:embed leaky_bucket.lua
	LeakyBucket string
	//go:embed concurrency.lua
	Concurrency string
	//go:embed ban.lua
	Ban string
)
