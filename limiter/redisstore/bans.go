package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

var banScript = redis.NewScript(luascripts.Ban)

// banKeys are the Redis keys of r's ban and refusal count: the bucket's
// key with ":b" and ":r", in its hash slot.
func (s *Store) banKeys(r bucket.Request) []string {
	k := s.key(r)
	return []string{k + ":b", k + ":r"}
}

// banMode is what the ban script does: its ARGV[1] (see ban.lua), sent as
// the string it is.
type banMode string

// The ban script's modes.
const (
	banCheck banMode = "check" // read the ban
	banDeny  banMode = "deny"  // count a denial, and ban after enough
	banSet   banMode = "set"   // ban for a time, unless longer already
)

func banArgs(mode banMode, b bucket.Ban) []any {
	return []any{string(mode), b.After, b.Within.Milliseconds(), b.For.Milliseconds()}
}

// Banned looks up the bans of reqs in one round trip.
func (s *Store) Banned(ctx context.Context, reqs []bucket.Request) ([]time.Duration, error) {
	left := make([]time.Duration, len(reqs))
	cmds := make([]*redis.Cmd, len(reqs))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range reqs {
			if r.Policy.Ban.After > 0 {
				cmds[i] = banScript.EvalSha(ctx, p, s.banKeys(r), banArgs(banCheck, r.Policy.Ban)...)
			}
		}
		return nil
	})
	if err != nil && !redis.HasErrorPrefix(err, "NOSCRIPT") {
		return nil, err
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			cmd = banScript.Run(ctx, s.client, s.banKeys(reqs[i]), banArgs(banCheck, reqs[i].Policy.Ban)...)
		}
		v, err := cmd.Result()
		if err != nil {
			return nil, err
		}
		ints, err := replyInts(v, 2)
		if err != nil {
			return nil, err
		}
		left[i] = time.Duration(ints[0]) * time.Millisecond
	}
	return left, nil
}

// Refused counts a refusal of r's client, and bans it after enough.
func (s *Store) Refused(ctx context.Context, r bucket.Request) (time.Duration, bool, error) {
	if r.Policy.Ban.After == 0 {
		return 0, false, nil
	}
	v, err := banScript.Run(ctx, s.client, s.banKeys(r), banArgs(banDeny, r.Policy.Ban)...).Result()
	if err != nil {
		return 0, false, err
	}
	ints, err := replyInts(v, 2)
	if err != nil {
		return 0, false, err
	}
	return time.Duration(ints[0]) * time.Millisecond, ints[1] == 1, nil
}

// Ban bans r's client for left, unless its ban in place lasts longer: a
// ban that another region's zone started (package regions).
func (s *Store) Ban(ctx context.Context, r bucket.Request, left time.Duration) error {
	if left < time.Millisecond {
		return nil
	}
	b := r.Policy.Ban
	b.For = left
	return banScript.Run(ctx, s.client, s.banKeys(r), banArgs(banSet, b)...).Err()
}
