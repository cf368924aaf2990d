package ratelimit

// The configuration of regions: one limit across the regions of a fleet
// (Handler.Regions, Zone.Global), its Caddyfile parsing and its checks,
// the peers' Redis as the limiter takes them (limiter.Regions), and the
// bounds of the global zones, logged as a config loads.

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// RegionsConfig is the regions a fleet spans, each deciding from its own
// Redis (the handler's redis block), for the zones that are Global: one
// limit for the whole world. Each region tells the others' Redis, every
// Sync, what it admitted.
type RegionsConfig struct {
	// This is this region's name: 1 to 32 characters of a-z, 0-9, '_'
	// and '-'. Required.
	This string `json:"this"`

	// Peers are the other regions' Redis, by region name (named as This
	// is), each configured as the handler's redis block. At least one;
	// never This.
	Peers map[string]*RedisConfig `json:"peers"`

	// Sync is how often this region tells the others what it admitted:
	// from 100ms to 1m. Default: 1s.
	Sync caddy.Duration `json:"sync,omitempty"`

	at caddyfile.Token // its regions line in the Caddyfile, for errors
}

// Bounds and default of RegionsConfig.Sync.
const (
	defaultRegionsSync = time.Second
	minRegionsSync     = 100 * time.Millisecond
	maxRegionsSync     = time.Minute
)

// interval is how often this region tells the others what it admitted:
// Sync, or the default.
func (c *RegionsConfig) interval() time.Duration {
	if c.Sync == 0 {
		return defaultRegionsSync
	}
	return time.Duration(c.Sync)
}

// maxRegionName is the longest region name.
const maxRegionName = 32

// checkRegionName refuses a region name that is not 1 to 32 characters of
// a-z, 0-9, '_' and '-'.
func checkRegionName(name string) error {
	if name == "" || len(name) > maxRegionName || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789_-") != "" {
		return fmt.Errorf("region name %q: want 1 to %d characters of a-z, 0-9, '_' and '-', such as eu or us-east-1", name, maxRegionName)
	}
	return nil
}

// Why a configuration of regions is wrong, with how to fix it.
var (
	errRegionsNeedRedis = errors.New("regions needs a redis block: each region decides from its own Redis, " +
		"and tells the others' Redis what it admitted; add redis { addresses <this region's Redis> }")
	errGlobalNeedsRegions = errors.New("global needs regions: a limit for the whole world is shared across the regions " +
		"of the handler's regions block; add regions <this region> { <region> { addresses <its Redis> } }, or leave global out")
	errNoPeers = errors.New("regions: no other region: add a block per other region with its Redis, " +
		"such as us { addresses redis-us:6379 } (a fleet in one region needs no regions)")
)

// errThisIsPeer is the error of a peer region named as this region.
func errThisIsPeer(name string) error {
	return fmt.Errorf("regions: %q is this region: list only the other regions, each with its Redis "+
		"(this region's Redis is the redis block)", name)
}

// checkRegions checks the handler's regions and the zones that are
// global, for a JSON config as for a Caddyfile (whose parser reports the
// same errors at their lines: checkCaddyfileRegions). Each zone's check
// refuses a global zone of a kind that cannot be (Zone.checkGlobal).
func (h *Handler) checkRegions() error {
	if h.Regions == nil {
		for _, name := range sortedNames(h.Zones) {
			if z := h.Zones[name]; z != nil && z.Global {
				return fmt.Errorf("zone %q: %w", name, errGlobalNeedsRegions)
			}
		}
		return nil
	}
	if h.Redis == nil {
		return errRegionsNeedRedis
	}
	if err := h.Regions.check(); err != nil {
		return err
	}
	return h.Regions.checkKeys(h.Redis)
}

// checkKeys refuses a peer whose keys would not name this region's
// buckets: a region charges the others' buckets by their keys, the key
// prefix and the digest of the client key (keyed by key_secret).
func (c *RegionsConfig) checkKeys(home *RedisConfig) error {
	prefix := cmp.Or(home.KeyPrefix, limiter.DefaultKeyPrefix)
	for _, name := range slices.Sorted(maps.Keys(c.Peers)) {
		p := c.Peers[name]
		if got := cmp.Or(p.KeyPrefix, limiter.DefaultKeyPrefix); got != prefix {
			return fmt.Errorf("regions: region %q: key_prefix %q is not this region's %q: every region keeps a global zone's buckets "+
				"under one prefix, and charges the others' by name; give each region's Redis the same key_prefix", name, got, prefix)
		}
		if p.KeySecret != "" && p.KeySecret != home.KeySecret {
			return fmt.Errorf("regions: region %q: key_secret is not this region's: client keys are hashed with it, so every region "+
				"needs the same; leave it out of the peer blocks (they take this region's)", name)
		}
	}
	return nil
}

// check checks c's names, its peers' Redis (as a redis block's) and its
// sync.
func (c *RegionsConfig) check() error {
	if c.This == "" {
		return fmt.Errorf("regions: this is required: the name of the region this Caddy is in, such as eu")
	}
	if err := checkRegionName(c.This); err != nil {
		return fmt.Errorf("regions: this: %w", err)
	}
	if len(c.Peers) == 0 {
		return errNoPeers
	}
	for _, name := range slices.Sorted(maps.Keys(c.Peers)) {
		if err := checkRegionName(name); err != nil {
			return fmt.Errorf("regions: peers: %w", err)
		}
		if name == c.This {
			return errThisIsPeer(name)
		}
		if err := checkPeer(c.Peers[name]); err != nil {
			return fmt.Errorf("regions: region %q: %w", name, err)
		}
	}
	if s := time.Duration(c.Sync); s != 0 && (s < minRegionsSync || s > maxRegionsSync) {
		return fmt.Errorf("regions: sync %s: want an interval from %s to %s, such as 1s (the default)", s, minRegionsSync, maxRegionsSync)
	}
	return nil
}

// checkPeer checks a peer region's Redis as the handler's redis block is
// checked when it is provisioned; its errors start with "redis: ".
func checkPeer(peer *RedisConfig) error {
	if peer == nil {
		return fmt.Errorf("redis: no configuration: give its addresses, as a redis block's")
	}
	if _, err := peer.resolve(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	_, err := peer.keyHasher() // "redis: key_secret ..."
	return err
}

// checkGlobal refuses a global zone of a kind whose limit cannot be one
// across regions: only the token bucket's can, whose admissions a region
// can be told of after the fact and charge as they come.
func (z *Zone) checkGlobal() error {
	if !z.Global {
		return nil
	}
	switch {
	case z.MaxConcurrent != 0:
		return about(fmt.Errorf("global does not apply to max_concurrent: requests in flight are held and released "+
			"in one region, and are not admissions that can be told to the other regions; leave global out (the limit is per region)"),
			"global", "max_concurrent")
	case z.settles():
		return about(fmt.Errorf("global does not apply with count_status or cost_from_response: what they give back "+
			"or charge after the response is not told to the other regions; leave global out, or count every request"),
			"global", "count_status", "cost_from_response")
	}
	algo, err := bucket.ParseAlgorithm(z.algorithm())
	if err != nil || algo == limiter.TokenBucket {
		return nil // an unknown algorithm is compilePolicy's to report
	}
	return about(fmt.Errorf("global needs algorithm token_bucket (the default), not %s: %s", algo, globalRefusals[algo]),
		"global", "algorithm", "events", "window")
}

// globalRefusals say why a zone of each algorithm but the token bucket
// cannot be global, and what to use.
var globalRefusals = map[limiter.Algorithm]string{
	limiter.FixedWindow:          windowNotGlobal,
	limiter.SlidingWindowCounter: windowNotGlobal,
	limiter.SlidingWindowLog: "its state is the time of each request it admitted, and it cannot take a charge made " +
		"in another region after the fact; use token_bucket",
	limiter.LeakyBucket: "its state is the queue of requests waiting their turn in this region, and it cannot take " +
		"a charge made in another region after the fact; use token_bucket with a burst",
}

const windowNotGlobal = "a window's limit is spent at once: a region could spend a whole window before the others " +
	"hear of it, so the world would admit up to one window per region; use token_bucket with a burst"

// parseGlobal parses a zone's global, which takes no argument.
func parseGlobal(d *caddyfile.Dispenser, z *Zone) error {
	if d.NextArg() {
		return d.Errf("zone %q: global takes no argument, not %q: write global alone, and the zone has one limit "+
			"across the regions of the regions block", z.name, d.Val())
	}
	z.Global = true
	return nil
}

// UnmarshalCaddyfile parses a regions block (see
// Handler.UnmarshalCaddyfile):
//
//	regions <this region> {
//		<region> {
//			<what a redis block takes>
//		}
//		sync <interval>
//	}
func (c *RegionsConfig) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // "regions"
	c.at = d.Token()
	if !d.NextArg() {
		return d.Err("regions needs this region's name: regions <this region> { <region> { addresses <its Redis> } ... }")
	}
	c.This = d.Val()
	if err := checkRegionName(c.This); err != nil {
		return d.Errf("regions: %v", err)
	}
	if d.NextArg() {
		return d.Errf("regions takes one name, this region's, not %q too: the other regions go in its block", d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		if d.Val() == "sync" {
			err = c.parseSync(d)
		} else {
			err = c.parsePeer(d)
		}
		if err != nil {
			return err
		}
	}
	if len(c.Peers) == 0 {
		d.Reset()
		d.Next()
		return d.Err(errNoPeers.Error())
	}
	return nil
}

// parseSync parses the regions block's sync <interval>.
func (c *RegionsConfig) parseSync(d *caddyfile.Dispenser) error {
	if c.Sync != 0 {
		return d.Err("regions: sync is already set")
	}
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	t, err := caddy.ParseDuration(s)
	if err != nil || t < minRegionsSync || t > maxRegionsSync {
		return d.Errf("regions: sync %q: want an interval from %s to %s, such as 1s (the default)", s, minRegionsSync, maxRegionsSync)
	}
	c.Sync = caddy.Duration(t)
	return nil
}

// parsePeer parses a peer region's block, which takes what a redis block
// takes, and checks it as one.
func (c *RegionsConfig) parsePeer(d *caddyfile.Dispenser) error {
	name := d.Val()
	if err := checkRegionName(name); err != nil {
		return d.Errf("regions: %v", err)
	}
	if name == c.This {
		return d.Err(errThisIsPeer(name).Error())
	}
	if _, dup := c.Peers[name]; dup {
		return d.Errf("regions: region %q is given twice: one block per region", name)
	}
	seg := d.NewFromNextSegment()
	peer := new(RedisConfig)
	if err := peer.UnmarshalCaddyfile(seg); err != nil {
		return fmt.Errorf("regions: region %q: %w", name, err)
	}
	if err := peer.check(); err != nil {
		seg.Reset()
		seg.Next()
		return seg.Errf("regions: region %q: redis: %v", name, err)
	}
	if c.Peers == nil {
		c.Peers = make(map[string]*RedisConfig)
	}
	c.Peers[name] = peer
	return nil
}

// checkCaddyfileRegions reports, at its line, regions without a redis
// block, or a global zone without regions: what checkRegions refuses that
// only the whole handler tells.
func checkCaddyfileRegions(h *Handler) error {
	if h.Regions != nil {
		if h.Redis == nil {
			return errAt(h.Regions.at, errRegionsNeedRedis)
		}
		if err := h.Regions.checkKeys(h.Redis); err != nil {
			return errAt(h.Regions.at, err)
		}
		return nil
	}
	for _, name := range sortedNames(h.Zones) {
		z := h.Zones[name]
		if z == nil || !z.Global {
			continue
		}
		at := z.at
		for _, tok := range z.subdirectives {
			if tok.Text == "global" {
				at = tok
			}
		}
		return errAt(at, fmt.Errorf("zone %q: %w", name, errGlobalNeedsRegions))
	}
	return nil
}

// errAt is err at the line of tok.
func errAt(tok caddyfile.Token, err error) error {
	d := caddyfile.NewDispenser([]caddyfile.Token{tok})
	d.Next()
	return d.WrapErr(err)
}

// Interface guard.
var _ caddyfile.Unmarshaler = (*RegionsConfig)(nil)

// defaultPeerTimeout is a peer region's Redis timeout when its block sets
// none: a round trip between regions takes 70-150 ms, more than a
// region's own Redis's default.
const defaultPeerTimeout = time.Second

// regionsKey names the regions of c in a store's pool key: handlers of one
// Redis with different regions have stores of their own.
func (c *RegionsConfig) regionsKey() (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return " regions:" + hex.EncodeToString(sum[:]), nil
}

// limiterRegions are the regions of c as the limiter takes them: each
// peer's Redis resolved as a redis block is, with defaultPeerTimeout when
// its block sets no timeout.
func (c *RegionsConfig) limiterRegions() (*limiter.Regions, error) {
	r := &limiter.Regions{This: c.This, Peers: map[string]limiter.RedisOptions{}, Interval: c.interval()}
	for _, name := range slices.Sorted(maps.Keys(c.Peers)) {
		cfg := *c.Peers[name]
		if cfg.Timeout == 0 {
			cfg.Timeout = caddy.Duration(defaultPeerTimeout)
		}
		o, err := cfg.limiterOptions()
		if err != nil {
			return nil, fmt.Errorf("regions: region %q: redis: %w", name, err)
		}
		r.Peers[name] = *o
	}
	return r, nil
}

// logRegionBounds logs, for each global zone of h, the regions, and how
// far beyond the world's exact limit they may admit together over any
// period while their links are up (regions.Bound).
func (h *Handler) logRegionBounds() {
	names := h.store.Regions()
	if names == nil {
		return
	}
	links, counted := h.store.RegionLinks()
	down := []string{}
	for _, l := range links {
		regionMetrics.linkUp.WithLabelValues(l.Region).Set(boolGauge(l.Up))
		regionMetrics.heard.WithLabelValues(l.Region).Set(boolGauge(l.Heard))
		if !l.Up {
			down = append(down, l.Region)
		}
	}
	for _, z := range h.zones {
		if !z.Global {
			continue
		}
		if z.policy.Algorithm == limiter.Quota {
			h.logQuotaBound(z, names, down, counted)
			continue
		}
		share := h.store.RegionShare(z.policy)
		h.logger.Info("zone is global: each region decides from its own Redis, spending unseen its part of the burst (the whole burst while no other region asks for the client), and tells the others what it admitted every sync; over any period the regions together may admit beyond the exact limit up to (regions − 1) × ⌈burst / regions⌉ + 2 × rate × (sync + timeout)",
			zap.String("zone", z.name), zap.Strings("regions", names), zap.Strings("links_down", down),
			zap.Int("regions_counted", counted), zap.Duration("sync", h.Regions.interval()),
			zap.Int64("burst_here", share.Burst), zap.Float64("bound", math.Round(h.store.RegionBound(z.policy))))
	}
}

// logQuotaBound is logRegionBounds for a global quota.
func (h *Handler) logQuotaBound(z *Zone, names, down []string, counted int) {
	h.logger.Info("zone is global: each region counts the quota in its own Redis, spending unseen its share of what the period has left (the whole quota while no other region asks for the client), and tells the others what it counted every sync; in each period the regions together may admit beyond the quota up to (regions − 1) × ⌈quota / regions⌉",
		zap.String("zone", z.name), zap.Strings("regions", names), zap.Strings("links_down", down),
		zap.Int("regions_counted", counted), zap.Duration("sync", h.Regions.interval()),
		zap.Int64("quota_share", limiter.RegionQuotaShare(z.policy.Rate, len(names))),
		zap.Float64("bound", math.Round(h.store.RegionBound(z.policy))))
}
