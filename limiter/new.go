package limiter

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/fleetsync"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// Config is what New makes a Limiter of. Its zero value is a Limiter of
// this process's memory alone; Redis makes it share its buckets with every
// instance that uses the same Redis; Storage, without Redis, has its zones
// that sync share their counts through a storage.
type Config struct {
	// Redis is the Redis that decides; nil: memory (or Storage).
	Redis *RedisOptions
	// LocalCache is how many clients Redis refused are remembered, to
	// refuse them here without a round trip until they could pass (0:
	// none); LocalCacheMaxAge is the longest one is, so that a reset
	// through another instance reaches this one.
	LocalCache       int
	LocalCacheMaxAge time.Duration

	// Storage, without Redis, is where the zones that sync share their
	// counts with the other instances that write to it (see
	// fleetsync.StorageFleet); the other zones decide in memory.
	Storage        Storage
	StorageOptions StorageOptions

	// Regions, with Redis, make the global zones one limit across the
	// regions of a fleet (package limiter/regions).
	Regions *Regions

	// Who is told what happens, besides the verdicts; nil: nobody.
	Nodes        NodeEvents       // the Redis nodes' breakers
	Sync         SyncEvents       // the rounds of the zones that sync
	RegionEvents RegionEvents     // the links to the peer regions
	Overrides    overrides.Events // the run-time overrides
}

// Regions are the regions a Limiter's global zones span: this one's name,
// the others' Redis by name, and how often this instance tells them what
// it admitted. Each exchange waits at most the longest of the peers'
// timeouts.
type Regions struct {
	This     string
	Peers    map[string]RedisOptions
	Interval time.Duration
	// Fingerprint is what the regions must agree on (see
	// Limiter.SetRegionFingerprint), from the first exchange.
	Fingerprint RegionFingerprint
}

// Aliases of the types a Config is made of, so that its users need no
// other package.
type (
	RedisOptions   = redisstore.Options
	Storage        = fleetsync.Storage
	StorageOptions = fleetsync.StorageOptions
	StorageEvents  = fleetsync.StorageEvents
	FileSystem     = fleetsync.FileSystem
	SyncEvents     = fleetsync.Events
	RegionEvents   = regions.Events
	RegionLink     = regions.Link
	// RegionFingerprint is what the regions of global zones must agree
	// on; ZoneFingerprint a global zone's part of it.
	RegionFingerprint = regions.Fingerprint
	ZoneFingerprint   = regions.ZoneFingerprint
	Breaker           = redisstore.Breaker
)

// Store-wide figures and defaults, for configs and their messages.
const (
	DefaultKeyPrefix      = redisstore.DefaultKeyPrefix
	BreakerCooldown       = redisstore.BreakerCooldown
	MinMemoryCapacity     = memstore.MinCapacity
	DefaultMemoryCapacity = memstore.DefaultCapacity
)

// New makes the Limiter of c; Close stops it and closes its stores. With
// Redis, nothing is sent before the first call (Ping checks it); with a
// Storage, the others' counts are read and this instance's written before
// New returns (each within StorageOptions' timeout).
func New(c Config) (*Limiter, error) {
	c.Overrides = cmp.Or[overrides.Events](c.Overrides, nopEvents{})
	switch {
	case c.Redis != nil:
		return newRedis(c)
	case c.Storage != nil:
		return newStorage(c), nil
	}
	l := &Limiter{memory: memstore.New(0), timeout: time.Second}
	l.overrides = overrides.NewMemory(c.Overrides)
	return l, nil
}

// newRedis is New with Redis.
func newRedis(c Config) (*Limiter, error) {
	store, err := redisstore.Open(*c.Redis)
	if err != nil {
		return nil, err
	}
	l := &Limiter{redis: store, memory: memstore.New(0), timeout: cmp.Or(c.Redis.Timeout, time.Second),
		refused: NewRefusedCache(c.LocalCache, c.LocalCacheMaxAge)}
	l.retries = newReleaseRetries(store, max(l.timeout, time.Second))
	l.sync = fleetsync.NewSyncer(store, l.memory, max(l.timeout, time.Second))
	if c.Sync != nil {
		l.sync.OnEvents(c.Sync)
	}
	nodes := cmp.Or[NodeEvents](c.Nodes, nopEvents{})
	store.OnBreaker(nodes.BreakerChanged)
	store.OnForget(func(node string) {
		if _, was := l.failing.LoadAndDelete(node); was { // no request will tell its recovery
			l.nFailing.Add(-1)
		}
		nodes.NodeGone(node)
	})
	l.overrides = overrides.NewRedis(store.Client(), store.Prefix(), c.Redis.DB, c.Overrides)
	if c.Regions != nil {
		if err := l.startRegions(c.Regions, c.RegionEvents); err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("regions: %w", err)
		}
	}
	return l, nil
}

// newStorage is New with a Storage.
func newStorage(c Config) *Limiter {
	f := fleetsync.NewStorageFleet(c.Storage, c.StorageOptions)
	l := &Limiter{memory: memstore.New(0), timeout: time.Second, fleet: f}
	l.sync = fleetsync.NewSyncer(f, l.memory, l.timeout)
	if c.Sync != nil {
		l.sync.OnEvents(c.Sync)
	}
	l.overrides = overrides.NewMemory(c.Overrides)
	f.Start()
	return l
}

// startRegions dials the peers of r, with a writer of the global zones'
// overrides in each, and starts the exchange with them.
func (l *Limiter) startRegions(r *Regions, ev RegionEvents) error {
	peers, writers := map[string]regions.Peer{}, map[string]*overrides.Writer{}
	timeout := time.Duration(0)
	for _, name := range slices.Sorted(maps.Keys(r.Peers)) {
		o := r.Peers[name]
		st, err := redisstore.Open(o)
		if err != nil {
			return fmt.Errorf("region %q: redis: %w", name, err)
		}
		l.peers = append(l.peers, st)
		peers[name], timeout = st, max(timeout, o.Timeout)
		writers[name] = overrides.NewRedisWriter(st.Client(), st.Prefix(), o.DB)
	}
	x := regions.New(regions.Config{This: r.This, Home: l.redis, Peers: peers, Writers: writers,
		Interval: r.Interval, Timeout: cmp.Or(timeout, time.Second), Fingerprint: r.Fingerprint})
	if ev != nil {
		x.OnEvents(ev)
	}
	l.regions = x
	x.Start()
	return nil
}

// nopEvents hears nothing: the events of a Config that names no one.
type nopEvents struct{}

func (nopEvents) BreakerChanged(string, bool)                               {}
func (nopEvents) NodeGone(string)                                           {}
func (nopEvents) OverridesLoaded(*overrides.Set, string, []overrides.Entry) {}
func (nopEvents) OverridesNotPushed(error)                                  {}
func (nopEvents) OverrideSkipped(string, error)                             {}
func (nopEvents) OverridesRestored(int, string)                             {}
func (nopEvents) OverridesOverLimit(int, int)                               {}
func (nopEvents) OverridesFailing(error)                                    {}

// What the errors of a Redis store say, for reports.
var (
	// ErrBreakerOpen: the call was not sent, its node's breaker being
	// open after consecutive failures.
	ErrBreakerOpen = redisstore.ErrBreakerOpen
	// AuthFailed reports whether err is Redis refusing the credentials.
	AuthFailed = redisstore.AuthFailed
	// ReplyCode is the code of a Redis error reply in err (NOSCRIPT, OOM,
	// ...), and whether err is one: Redis answered, with an error.
	ReplyCode = redisstore.ReplyCode
	// SetRedisLogger routes the Redis client's own log lines (failed
	// dials and the like) to log.
	SetRedisLogger = redisstore.SetLogger
)
