package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

// quietEvents are the Events of a Limiter under test: none is looked at.
type quietEvents struct{}

func (quietEvents) StoreFailing(error)               {}
func (quietEvents) StoreRecovered(string)            {}
func (quietEvents) ScriptFailed(error, bool)         {}
func (quietEvents) BanStarted(string, time.Duration) {}
func (quietEvents) BreakerChanged(string, bool)      {}
func (quietEvents) NodeGone(string)                  {}
func (quietEvents) Debug(string, error)              {}

// TestReleaseRetriesChunked: a round sends many pending releases in small
// calls (or small requests of a batched call), each all or nothing on its
// own, not as one script run over every key: one release that fails (a
// key of another type) holds back its chunk, not every other client's.
func TestReleaseRetriesChunked(t *testing.T) {
	srv := redistest.NewServer(t)
	prefix := fmt.Sprintf("slots%x:", rand.Uint64())
	l, err := New(Config{Redis: &RedisOptions{Addresses: []string{srv.Addr}, KeyPrefix: prefix}, Nodes: quietEvents{}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := Policy{Algorithm: Concurrency, Slots: 1, Lease: 5 * time.Minute}
	var pending []pendingRelease
	for i := range 100 {
		req := Request{Zone: "slots", Key: fmt.Sprint("client-", i), Policy: p, Cost: 1, ID: fmt.Sprint("request-", i)}
		pending = append(pending, pendingRelease{req: req, until: time.Now().Add(time.Minute)})
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	bad := redisstore.RedisKey(prefix, "slots", pending[50].req.Digest()) + ":m"
	if err := c.Set(context.Background(), bad, "not a set of leases", 0).Err(); err != nil {
		t.Fatal(err)
	}
	left := l.retries.round(pending)
	if len(left) == 0 || len(left) > 20 {
		t.Fatalf("%d releases left after a round where one key is of another type; want that one's chunk, at most 20", len(left))
	}
	for _, p := range left {
		if p.req.Key == pending[50].req.Key {
			return
		}
	}
	t.Fatal("the failing release is not among those left to try again")
}

// TestRefusalHoldsNoSlots: a request that a zone refused took no slot, so
// its verdict has nothing to release; the allowed one's has.
func TestRefusalHoldsNoSlots(t *testing.T) {
	l := mustNew(t, Config{})
	defer l.Close()
	slots := Policy{Algorithm: Concurrency, Slots: 2, Lease: time.Minute}
	tight := Policy{Algorithm: TokenBucket, Rate: 1, Period: time.Hour, Burst: 1}
	reqs := func(id string) []Request {
		return []Request{{Zone: "refusal_slots", Key: "k", Policy: slots, Cost: 1, ID: id},
			{Zone: "refusal_tight", Key: "k", Policy: tight, Cost: 1, ID: id}}
	}
	var allowed, refused Verdict
	l.Decide(t.Context(), time.Now(), reqs("first"), Caller{Events: quietEvents{}}, &allowed)
	if allowed.States[0] != Allowed || allowed.release == nil {
		t.Fatalf("first request: %v, release %v; want allowed, with a slot to release", allowed.States, allowed.release != nil)
	}
	l.Decide(t.Context(), time.Now(), reqs("second"), Caller{Events: quietEvents{}}, &refused)
	if refused.States[1] != Refused || refused.release != nil {
		t.Fatalf("second request: %v, release %v; want refused, nothing to release", refused.States, refused.release != nil)
	}
	allowed.Release()
}
