// Package luascripts holds the Redis Lua scripts of the Redis store,
// embedded in the binary.
package luascripts

import _ "embed"

// TokenBucket charges or refunds token buckets, all or nothing; see the
// header of token_bucket.lua for its keys, arguments and reply.
//
//go:embed token_bucket.lua
var TokenBucket string
