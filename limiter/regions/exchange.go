package regions

import (
	"context"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// Peer is another region's Redis, as an exchange speaks to it: a
// redisstore.Store.
type Peer interface {
	// ChargeAll charges every request its cost, into debt if need be; an
	// error that is not bucket.MayHaveRun charged nothing.
	ChargeAll(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error)
	// Groups splits reqs into the calls of one exchange.
	Groups(ctx context.Context, reqs []bucket.Request) [][]int
	// MarkRegion marks region as having exchanged with this Redis, for
	// ttl, with mark (its Fingerprint).
	MarkRegion(ctx context.Context, region, mark string, ttl time.Duration) error
	// Ban bans r's client for left, unless it is banned longer.
	Ban(ctx context.Context, r bucket.Request, left time.Duration) error
	// Prepare connects and loads what an exchange runs, so that the
	// first costs no more than the others.
	Prepare(ctx context.Context) error
	// Ping checks that the peer answers: an exchange of a degraded link
	// that charges nothing (see health.go).
	Ping(ctx context.Context) error
}

// Home is this region's own Redis, where the others mark themselves.
type Home interface {
	// RegionMarks reads each region's mark there, "" for none, each at
	// most maxMark bytes.
	RegionMarks(ctx context.Context, regions []string, limit int) ([]string, error)
}

// Events are told of the links to the peer regions. Their methods must not
// block.
type Events interface {
	// LinkChanged: the link to peer went down (err says why) or came back.
	LinkChanged(peer string, up bool, err error)
	// Exchanged: an exchange with peer charged keys buckets in took; err
	// is its failure.
	Exchanged(peer string, keys int, took time.Duration, err error)
	// Heard: peer's mark went missing from this region's Redis (it is
	// counted at its share) or came back.
	Heard(peer string, heard bool)
	// Flooding: more buckets than an instance keeps counts of came (on),
	// or none for LinkTimeout (off): see flood.go.
	Flooding(on bool)
	// ConfigDiffers: peer's fingerprint differs from this region's (diff
	// says what differs), or agrees again (diff is ""); until it agrees,
	// it is not heard.
	ConfigDiffers(peer, diff string)
	// Dropped: counts of n buckets were dropped, for peer ("" for every
	// peer: more buckets than maxBacklog), because its link was down or
	// the backlog full. Called at most once per interval and peer.
	Dropped(peer string, n int)
}

// Config is what an Exchange is made of.
type Config struct {
	// This is this region's name; Regions counts every region, this one
	// included.
	This string
	// Home is this region's Redis; Peers the others', by name.
	Home  Home
	Peers map[string]Peer
	// Writers write the overrides of global zones to the peers' Redis, by
	// name (see CopyOverride); none: overrides are not copied.
	Writers map[string]*overrides.Writer
	// Interval is how often this instance tells the peers what it
	// admitted; Timeout bounds each exchange.
	Interval, Timeout time.Duration
	// Fingerprint is what the regions must agree on, until
	// SetFingerprint (see fingerprint.go).
	Fingerprint Fingerprint
}

// maxBacklog bounds the buckets an instance keeps counts of, since the
// last interval and for each peer; past it, the counts of new buckets are
// dropped, reported, and the instance floods (see flood.go).
const maxBacklog = 1 << 18

// linkTimeouts is how many exchanges (an interval and a timeout each) a
// link may go without one that succeeded before it is down, and how many
// a region's mark lives.
const linkTimeouts = 2

// Exchange tells the peer regions what this instance admitted in the
// global zones, and scales their policies to the region's share (see the
// package doc).
type Exchange struct {
	cfg              Config
	id               string // this instance's, in the peers' records of its charges (charges.go)
	regions          int64
	tags             [2]string // Tag's: "G<R>:<D>", "A<R>:<D>"
	mu               sync.Mutex
	pending          map[bucket.ID]count              // admitted since the last interval
	policies         map[bucket.Policy]*bucket.Policy // the policies of the counts, each once (at most maxPolicies)
	overflow         int                              // requests not counted since the last interval: pending was full
	peers            []*sender
	names            []string
	counted          atomic.Int64          // regions counted as admitting up to the rate (see Policy)
	own              atomic.Pointer[owned] // this region's fingerprint, and its mark
	floodUntil       atomic.Int64          // Unix ns: until when it floods (flood.go)
	floodReported    bool                  // a flood reported, not its end yet (count's)
	ev               atomic.Pointer[Events]
	now              func() time.Time
	started          time.Time       // when Start ran
	phase            time.Duration   // the first hand-out's delay after Start, in [0, Interval): see tick
	stop             chan struct{}   // closed by Close: the ticker's last hand-out
	stopSenders      chan struct{}   // then the senders' last exchange
	copies           *overrideCopies // the changes of overrides to copy to the peers
	ticking, senders sync.WaitGroup
	start            sync.Once
	close            sync.Once
}

// count is what this instance admitted of one bucket (its ID the key of
// the map that holds it), the policy a peer is charged with, and the
// bucket's level, if it refused; a quota's, of the period that ends at
// period: 32 bytes.
type count struct {
	p      *bucket.Policy
	cost   int64
	empty  int64 // Unix ns: when this region's bucket was last empty, as it refused (see Refused); a quota's count; 0: none
	period int64 // a quota's: the Unix µs its period ends at; 0: none (a token bucket)
}

// merged is c with what d adds: their sums and levels, of the later
// period of the two (a count of an earlier period is none: that period's
// count went with it).
func (c count) merged(d count) count {
	switch {
	case d.period > c.period:
		c.cost, c.empty, c.period = 0, 0, d.period
	case d.period < c.period:
		return c
	}
	c.cost, c.empty = min(c.cost+d.cost, math.MaxInt64/2), max(c.empty, d.empty)
	return c
}

// maxPolicies bounds the policies an Exchange keeps once (zones' and their
// tiers'); others are kept with each count.
const maxPolicies = 4096

// New makes an Exchange of cfg; Start starts it.
func New(cfg Config) *Exchange {
	x := &Exchange{cfg: cfg, id: strconv.FormatUint(rand.Uint64()>>16, 36), regions: int64(len(cfg.Peers) + 1), pending: map[bucket.ID]count{},
		policies: map[bucket.Policy]*bucket.Policy{},
		now:      time.Now, stop: make(chan struct{}), stopSenders: make(chan struct{})}
	for _, name := range slices.Sorted(maps.Keys(cfg.Peers)) {
		x.peers = append(x.peers, newSender(x, name, cfg.Peers[name]))
		x.names = append(x.names, name)
	}
	x.phase = time.Duration(rand.Int64N(int64(max(cfg.Interval, 1))))
	x.counted.Store(1)                                                      // alone until every peer is told and heard (count)
	d := strconv.FormatInt((cfg.Interval + cfg.Timeout).Microseconds(), 10) // how late a charge may reach a peer
	x.tags = [2]string{"G" + strconv.FormatInt(x.regions, 10) + ":" + d, "A" + strconv.FormatInt(x.regions, 10) + ":" + d}
	x.SetFingerprint(cfg.Fingerprint)
	x.copies = newOverrideCopies(cfg.Writers, cfg.Interval, cfg.Timeout)
	return x
}

// owned is this region's fingerprint and the mark that carries it.
type owned struct {
	f    Fingerprint
	mark string
}

// SetFingerprint sets what this region's marks carry from the next
// exchange on, and what the peers' are compared with.
func (x *Exchange) SetFingerprint(f Fingerprint) {
	x.own.Store(&owned{f: f, mark: f.Mark()})
}

// OnEvents sets who is told of the links.
func (x *Exchange) OnEvents(ev Events) { x.ev.Store(&ev) }

func (x *Exchange) events() Events {
	if ev := x.ev.Load(); ev != nil {
		return *ev
	}
	return nil
}

// Regions is the number of regions, this one included.
func (x *Exchange) Regions() int { return int(x.regions) }

// Policy is p, a global zone's policy, as this region decides it now: the
// region's share of the burst, and of the rate the regions counted as
// admitting leave it (the whole rate while every link is up).
func (x *Exchange) Policy(p bucket.Policy) bucket.Policy {
	return x.PolicyWith(p, x.Counted())
}

// PolicyWith is Policy with k regions counted (Counted).
func (x *Exchange) PolicyWith(p bucket.Policy, k int64) bucket.Policy {
	if p.Algorithm != bucket.TokenBucket || p.Rate <= 0 {
		return p
	}
	p.Burst = ShareOf(p.Burst, x.regions)
	if k = max(k, 1); k < x.regions {
		p.Period = p.Period * time.Duration(x.regions) / time.Duration(k)
	}
	return p
}

// Tag is the id of a global zone's take or peek in a token bucket (an
// exact one: not synced) with k regions counted: "G<R>:<D>" with every
// region counted, "A<R>:<D>" alone, D the interval and timeout in µs, so
// that the bucket decides on the world's time, holding the whole burst
// while no other region may spend from it, or on the region's own (see
// token_bucket.lua); "" otherwise. A quota's take carries it too (see
// quota.lua), alone with fewer than every region counted (TagQuota).
func (x *Exchange) Tag(k int64) string {
	switch {
	case x.regions < 2:
		return ""
	case k >= x.regions:
		return x.tags[0]
	case k <= 1:
		return x.tags[1]
	}
	return ""
}

// TagQuota is Tag for a quota's take: alone unless every region is
// counted (a quota has no rate to scale to the regions counted).
func (x *Exchange) TagQuota(k int64) string {
	if k < x.regions {
		k = 1
	}
	return x.Tag(k)
}

// Counted is how many regions are counted as admitting up to the rate
// now (see Links).
func (x *Exchange) Counted() int64 { return x.counted.Load() }

// ShareOf is a region's share of n (a burst, a quota) among regions:
// ⌈n / regions⌉, at least 1.
func ShareOf(n, regions int64) int64 {
	regions = max(regions, 1)
	return max((n+regions-1)/regions, 1)
}

// Bound is how far over the exact limit the regions together may admit
// over any period, for policy p (the zone's, not scaled) while every link
// is up, in tokens: see the package doc.
//
// A quota's is (R − 1) × ⌈quota / R⌉: the regions spend unseen at most
// what the period had left, and, while one holds the whole quota, each
// other that starts asking its share of what it sees left (see
// quota.lua).
func Bound(p bucket.Policy, regions int, interval, timeout time.Duration) float64 {
	r := int64(regions)
	if p.Rate <= 0 || p.Period <= 0 || r < 2 {
		return 0
	}
	if p.Algorithm == bucket.Quota {
		return float64((r - 1) * ShareOf(p.Rate, r))
	}
	rate := float64(p.Rate) / p.Period.Seconds()
	return float64((r-1)*ShareOf(p.Burst, r)) + 2*rate*(interval+timeout).Seconds()
}

// Record counts what r, with its zone's policy (not scaled by Policy),
// admitted in a global zone, to tell the peers at the next interval. A
// peer is charged with the policy its region decides by while every link
// is up (the share of the burst). A request of a zone that is not global,
// in dry run, or of no cost counts nothing.
func (x *Exchange) Record(r *bucket.Request) {
	if !r.Global || r.DryRun || r.Cost <= 0 {
		return
	}
	x.add(r, count{cost: r.Cost})
}

// RecordPeriod is Record for a quota's admission counted in the period
// that ends at end (its decision's Reset): the peers count it in that
// period, and not in another.
func (x *Exchange) RecordPeriod(r *bucket.Request, end time.Time) {
	if !r.Global || r.DryRun || r.Cost <= 0 {
		return
	}
	x.add(r, count{cost: r.Cost, period: periodOf(end)})
}

// periodOf is a quota's period end as a count keeps it: in Unix µs, 0
// for none.
func periodOf(end time.Time) int64 {
	if end.IsZero() {
		return 0
	}
	return end.UnixMicro()
}

// Refused tells the peers, at the next interval, how far this region's
// bucket of r (a global zone's token bucket, r's policy the zone's) was
// spent when it refused r at now: d is the decision, by the policy scaled
// (by Policy). Each peer lifts its copy of the bucket to it, if it holds
// more: so that copies that differ, after what one region was not told,
// converge (see the package doc).
//
// A quota's level is its count in the period d's Reset ends.
func (x *Exchange) Refused(r *bucket.Request, scaled bucket.Policy, d bucket.Decision, now time.Time) {
	if !r.Global || r.DryRun || d.Cached || d.At.IsZero() || d.Reset.IsZero() || scaled.Rate <= 0 {
		return
	}
	switch {
	case scaled.Algorithm == bucket.Quota && d.Used > 0:
		x.add(r, count{empty: d.Used, period: periodOf(d.Reset)})
	case scaled.Algorithm == bucket.TokenBucket && scaled.Period > 0:
		full := time.Duration(float64(scaled.Period) / float64(scaled.Rate) * float64(scaled.Burst))
		x.add(r, count{empty: now.Add(d.Reset.Sub(d.At) - full).UnixNano()})
	}
}

// add adds c (its cost, level and period) to r's count.
func (x *Exchange) add(r *bucket.Request, c count) {
	id := bucket.IDOf(*r) // no client key kept
	x.mu.Lock()
	defer x.mu.Unlock()
	if have, ok := x.pending[id]; ok {
		x.pending[id] = have.merged(c)
		return
	}
	if len(x.pending) >= maxBacklog {
		if x.overflow == 0 {
			x.flooded()
		}
		x.overflow++
		return
	}
	p := r.Policy
	if p.Algorithm == bucket.TokenBucket {
		p.Burst = ShareOf(p.Burst, x.regions)
	}
	shared := x.policies[p]
	if shared == nil {
		shared = &p
		if len(x.policies) < maxPolicies {
			x.policies[p] = shared
		}
	}
	c.p = shared
	x.pending[id] = c
}

// Bound is Bound of p for this exchange's regions, interval and timeout.
func (x *Exchange) Bound(p bucket.Policy) float64 {
	return Bound(p, int(x.regions), x.cfg.Interval, x.cfg.Timeout)
}

// Names are the regions' names: this one's first, then the peers'.
func (x *Exchange) Names() []string { return append([]string{x.cfg.This}, x.names...) }

// Banned tells the peers, at the next interval, that r's client was
// banned by its global zone for left from now.
func (x *Exchange) Banned(r bucket.Request, left time.Duration) {
	if !r.Global || left <= 0 {
		return
	}
	until, anon := x.now().Add(left), r.Anonymous() // no client key kept
	for _, s := range x.peers {
		s.ban(anon, until)
	}
}
