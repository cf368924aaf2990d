package limiter

import (
	"sync"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// RefusedCache remembers, in this process, the clients a remote store has
// refused, so that their next requests are refused without asking it until
// they could pass (bounded by MaxAge): a client hammering past its limit
// costs no round trips. It is exact: nothing but time (or a reset) lets a
// refused client pass sooner. Safe for concurrent use.
type RefusedCache struct {
	mu      sync.Mutex
	size    int
	maxAge  time.Duration
	entries map[bucket.ID]refusedEntry
}

type refusedEntry struct {
	policy  Policy // the refusal holds for this policy only
	until   int64  // Unix ns: when the entry is dropped (at most maxAge)
	retryAt int64  // Unix ns: when the client could pass
	cost    int64
	d       Decision
}

// NewRefusedCache returns a cache of at most size clients, each kept at most
// maxAge (so that a reset through another instance reaches this one).
func NewRefusedCache(size int, maxAge time.Duration) *RefusedCache {
	return &RefusedCache{size: size, maxAge: maxAge, entries: make(map[bucket.ID]refusedEntry)}
}

// Get returns the refusal cached for r at now, if r has the same policy
// (a reload or a plan may change it) and costs at least what the refused
// request did.
func (c *RefusedCache) Get(r Request, now time.Time) (Decision, bool) {
	k := bucket.IDOf(r)
	c.mu.Lock()
	e, ok := c.entries[k]
	c.mu.Unlock()
	if !ok || now.UnixNano() >= e.until || r.Cost < e.cost || r.Policy != e.policy {
		return Decision{}, false
	}
	d := e.d
	d.RetryAfter = time.Duration(e.retryAt - now.UnixNano())
	d.Cached = true
	return d, true
}

// Put remembers a refusal of r at now until r could pass. Concurrency
// refusals are not kept (a slot may free at any time), nor those of
// policies that ban (each refusal counts towards a ban): see PutBan.
func (c *RefusedCache) Put(r Request, d Decision, now time.Time) {
	if r.Policy.Algorithm == Concurrency || r.Policy.Ban.After > 0 {
		return
	}
	c.PutBan(r, d, now)
}

// PutBan remembers a refusal of r at now, whatever its policy: for bans.
func (c *RefusedCache) PutBan(r Request, d Decision, now time.Time) {
	if d.Allowed || d.RetryAfter <= 0 || c.size <= 0 {
		return
	}
	until := now.Add(min(d.RetryAfter, c.maxAge)).UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.size {
		c.evict(now.UnixNano())
	}
	c.entries[bucket.IDOf(r)] = refusedEntry{policy: r.Policy, until: until, retryAt: now.Add(d.RetryAfter).UnixNano(), cost: r.Cost, d: d}
}

// evict makes room for a tenth of the cache at once (so that a flood of
// new clients costs a few map steps per entry, not a scan each): expired
// entries go, and others at random (map order is random) until then.
func (c *RefusedCache) evict(now int64) {
	target := c.size - c.size/10 - 1
	for k, e := range c.entries {
		if e.until <= now || len(c.entries) > target {
			delete(c.entries, k)
		}
	}
}

// Delete forgets r's client (after a reset).
func (c *RefusedCache) Delete(r Request) {
	c.mu.Lock()
	delete(c.entries, bucket.IDOf(r))
	c.mu.Unlock()
}

// Len is the number of clients cached.
func (c *RefusedCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
