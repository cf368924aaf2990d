package limiter

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

// memBans are the bans of a MemoryStore.
type memBans struct {
	mu      sync.Mutex
	clients map[bucketID]banState
}

type banState struct {
	refusals    int64
	windowEnd   int64 // Unix ns: when the refusals counted so far are forgotten
	bannedUntil int64
}

// BannedAt is Banned at an explicit time.
func (s *MemoryStore) BannedAt(now time.Time, reqs []Request) []time.Duration {
	left := make([]time.Duration, len(reqs))
	s.bans.mu.Lock()
	defer s.bans.mu.Unlock()
	for i, r := range reqs {
		if r.Policy.Ban.After == 0 {
			continue
		}
		if st, ok := s.bans.clients[bucketIDOf(r)]; ok && st.bannedUntil > now.UnixNano() {
			left[i] = time.Duration(st.bannedUntil - now.UnixNano())
		}
	}
	return left
}

// Banned is BannedAt now; it never fails.
func (s *MemoryStore) Banned(_ context.Context, reqs []Request) ([]time.Duration, error) {
	return s.BannedAt(time.Now(), reqs), nil
}

// RefusedAt is Refused at an explicit time.
func (s *MemoryStore) RefusedAt(now time.Time, r Request) (time.Duration, bool) {
	b := r.Policy.Ban
	if b.After == 0 {
		return 0, false
	}
	ns := now.UnixNano()
	s.bans.mu.Lock()
	defer s.bans.mu.Unlock()
	k := bucketIDOf(r)
	st := s.bans.clients[k]
	if st.bannedUntil > ns {
		return time.Duration(st.bannedUntil - ns), false
	}
	if st.windowEnd <= ns {
		st = banState{windowEnd: ns + int64(b.Within)}
	}
	st.refusals++
	started := st.refusals >= b.After
	if started {
		st = banState{bannedUntil: ns + int64(b.For)}
	}
	s.bans.clients[k] = st
	return time.Duration(max(st.bannedUntil-ns, 0)), started
}

// Refused is RefusedAt now; it never fails.
func (s *MemoryStore) Refused(_ context.Context, r Request) (time.Duration, bool, error) {
	left, started := s.RefusedAt(time.Now(), r)
	return left, started, nil
}

// sweepBans drops what has expired.
func (s *MemoryStore) sweepBans(now int64) {
	s.bans.mu.Lock()
	defer s.bans.mu.Unlock()
	for k, st := range s.bans.clients {
		if st.bannedUntil <= now && st.windowEnd <= now {
			delete(s.bans.clients, k)
		}
	}
}

var banScript = redis.NewScript(luascripts.Ban)

// banKeys are the Redis keys of r's ban and refusal count: the bucket's
// key with ":b" and ":r", in its hash slot.
func (s *RedisStore) banKeys(r Request) []string {
	k := s.key(r)
	return []string{k + ":b", k + ":r"}
}

func banArgs(mode string, b Ban) []any {
	return []any{mode, b.After, b.Within.Milliseconds(), b.For.Milliseconds()}
}

// Banned looks up the bans of reqs in one round trip.
func (s *RedisStore) Banned(ctx context.Context, reqs []Request) ([]time.Duration, error) {
	left := make([]time.Duration, len(reqs))
	cmds := make([]*redis.Cmd, len(reqs))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range reqs {
			if r.Policy.Ban.After > 0 {
				cmds[i] = banScript.EvalSha(ctx, p, s.banKeys(r), banArgs("check", r.Policy.Ban)...)
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
			cmd = banScript.Run(ctx, s.client, s.banKeys(reqs[i]), banArgs("check", reqs[i].Policy.Ban)...)
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
func (s *RedisStore) Refused(ctx context.Context, r Request) (time.Duration, bool, error) {
	if r.Policy.Ban.After == 0 {
		return 0, false, nil
	}
	v, err := banScript.Run(ctx, s.client, s.banKeys(r), banArgs("deny", r.Policy.Ban)...).Result()
	if err != nil {
		return 0, false, err
	}
	ints, err := replyInts(v, 2)
	if err != nil {
		return 0, false, err
	}
	return time.Duration(ints[0]) * time.Millisecond, ints[1] == 1, nil
}
