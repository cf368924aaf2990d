package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/luascripts"
)

// ChargeAll charges every request its cost (0: a reading), on the
// server's clock, in one batched call per node.
func (s *Store) ChargeAll(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	decisions := make([]bucket.Decision, len(reqs))
	idx := make([]int, len(reqs))
	for i := range idx {
		idx[i] = i
	}
	return decisions, s.settle(ctx, "", modeCharge, reqs, idx, nil, decisions)
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

// maxChargeBatch bounds one batched charge: a round of many buckets is
// sent in parts, so that no call holds Redis long.
const maxChargeBatch = 500

// Groups splits reqs by node, then into batches of at most
// maxChargeBatch.
func (s *Store) Groups(ctx context.Context, reqs []bucket.Request) [][]int {
	if !s.cluster { // one node: no lookups
		var parts [][]int
		for start := 0; start < len(reqs); start += maxChargeBatch {
			part := make([]int, min(maxChargeBatch, len(reqs)-start))
			for j := range part {
				part[j] = start + j
			}
			parts = append(parts, part)
		}
		return parts
	}
	byNode := map[string][]int{}
	var order []string
	for i, r := range reqs {
		node := s.nodes(ctx, s.scriptRuns([]bucket.Request{r}))[0]
		if _, ok := byNode[node]; !ok {
			order = append(order, node)
		}
		byNode[node] = append(byNode[node], i)
	}
	var parts [][]int
	for _, node := range order {
		idx := byNode[node]
		for len(idx) > maxChargeBatch {
			parts, idx = append(parts, idx[:maxChargeBatch]), idx[maxChargeBatch:]
		}
		parts = append(parts, idx)
	}
	return parts
}

// RegisterSync registers id in the sorted set of the instances that sync,
// on Redis's clock, and counts those registered within window.
func (s *Store) RegisterSync(ctx context.Context, id string, window time.Duration) (int64, error) {
	key := s.prefix + "{sync}:instances"
	return registerScript.Run(ctx, s.client, []string{key}, id, window.Milliseconds()).Int64()
}

// CountSync counts the instances registered within window, id counted
// whether it registered or not, on Redis's clock, registering nothing.
func (s *Store) CountSync(ctx context.Context, id string, window time.Duration) (int64, error) {
	key := s.prefix + "{sync}:instances"
	return countScript.Run(ctx, s.client, []string{key}, id, window.Milliseconds()).Int64()
}

// countScript counts the members of the sorted set KEYS[1] scored within
// ARGV[2] ms of Redis's time, ARGV[1] counted once whether it is or not.
var countScript = redis.NewScript(luascripts.SyncCount)

// registerScript registers ARGV[1] in the sorted set KEYS[1] at Redis's
// time, drops those older than ARGV[2] ms, and returns how many remain.
var registerScript = redis.NewScript(luascripts.SyncRegister)
