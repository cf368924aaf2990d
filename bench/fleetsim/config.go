package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// The modes of a run (-mode).
const (
	modeExact   = "exact"
	modeSync    = "sync"
	modeRegions = "regions"
)

// config is a run's flags, checked.
type config struct {
	instances, keys, workers, localCache int
	zipf, qps                            float64
	mode, rate                           string // rate: -rate as given
	policy                               limiter.Policy
	sync, exchange, timeout              time.Duration
	duration, warmup                     time.Duration
	regions                              []region
	seed                                 uint64
	keep                                 bool
}

// region is one region of a run: its name and its Redis.
type region struct {
	name    string
	addrs   []string
	cluster bool
}

// parseFlags reads the flags of args (without the program's name).
func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("fleetsim", flag.ContinueOnError)
	fs.IntVar(&c.instances, "instances", 3, "limiter instances (separate limiter.New each)")
	nRegions := fs.Int("regions", 0, "regions, the first of -redis (0: all it names)")
	fs.IntVar(&c.keys, "keys", 10000, "client keys")
	fs.Float64Var(&c.zipf, "zipf", 1.0, "Zipf exponent of the keys' popularity (0: uniform)")
	fs.StringVar(&c.mode, "mode", modeExact, "exact, sync or regions")
	rate := fs.String("rate", "10r/s", "the zone's rate per key, as the Caddyfile writes it")
	burst := fs.Int64("burst", 0, "the zone's burst (0: the rate's count)")
	fs.DurationVar(&c.sync, "sync", 100*time.Millisecond, "mode sync: how often instances sync")
	fs.DurationVar(&c.exchange, "exchange", time.Second, "mode regions: how often regions exchange (regions' sync)")
	fs.DurationVar(&c.timeout, "timeout", time.Second, "Redis timeout, of the home and peer regions")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "measured load")
	fs.DurationVar(&c.warmup, "warmup", 0, "load before the measured window (its decisions are replayed too)")
	redis := fs.String("redis", os.Getenv("RL_REDIS_STANDALONE"), "the regions' Redis: [name=][cluster:]addr[,addr...] separated by ';'")
	fs.IntVar(&c.workers, "workers", 64, "goroutines sending requests")
	fs.Float64Var(&c.qps, "qps", 0, "requests per second in all (0: as fast as the fleet decides)")
	fs.IntVar(&c.localCache, "localcache", 10000, "each instance's cache of refused clients (Caddy's local_cache; 0: off)")
	fs.Uint64Var(&c.seed, "seed", 0, "seed of the keys' and instances' draws (0: random)")
	fs.BoolVar(&c.keep, "keep", false, "keep the run's keys in Redis")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.rate = *rate
	n, period, err := bucket.ParseRate(*rate)
	if err != nil {
		return c, fmt.Errorf("-rate: %w", err)
	}
	c.policy = limiter.Policy{Algorithm: limiter.TokenBucket, Rate: n, Period: period, Burst: *burst}
	if c.policy.Burst == 0 {
		c.policy.Burst = bucket.DefaultBurst(limiter.TokenBucket, n)
	}
	if c.regions, err = parseRedis(*redis); err != nil {
		return c, fmt.Errorf("-redis: %w", err)
	}
	return c, c.check(*nRegions)
}

// check refuses flags that make no run, and keeps the first n regions.
func (c *config) check(n int) error {
	switch {
	case c.instances < 1, c.keys < 1, c.workers < 1:
		return errors.New("-instances, -keys and -workers must be at least 1")
	case c.keys >= 1<<31:
		return errors.New("-keys: at most 2^31 - 1")
	case c.zipf < 0:
		return errors.New("-zipf must be 0 or more")
	case c.duration <= 0 || c.sync <= 0 || c.exchange <= 0 || c.timeout <= 0:
		return errors.New("-duration, -sync, -exchange and -timeout must be positive")
	case c.duration+c.warmup > time.Hour:
		return errors.New("-duration and -warmup: at most an hour in all (decisions are timed in µs in 32 bits)")
	case c.policy.Burst < 1:
		return errors.New("-burst must be positive")
	case n < 0 || n > len(c.regions):
		return fmt.Errorf("-regions %d: -redis names %d", n, len(c.regions))
	}
	if n > 0 {
		c.regions = c.regions[:n]
	}
	switch c.mode {
	case modeExact, modeSync:
		if len(c.regions) > 1 {
			return fmt.Errorf("-mode %s takes one region; %d given (-regions 1 takes the first)", c.mode, len(c.regions))
		}
	case modeRegions:
		if len(c.regions) < 2 {
			return errors.New("-mode regions needs at least 2 regions in -redis")
		}
	default:
		return fmt.Errorf("-mode %q: want exact, sync or regions", c.mode)
	}
	return nil
}

// parseRedis parses -redis: regions separated by ';', each
// [name=][cluster:]address[,address...]; a region of more than one
// address is a Cluster. Unnamed regions are r1, r2, ...
func parseRedis(s string) ([]region, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("no Redis: give -redis (or set RL_REDIS_STANDALONE)")
	}
	var out []region
	names := map[string]bool{}
	for i, part := range strings.Split(s, ";") {
		part = strings.TrimSpace(part)
		r := region{name: fmt.Sprintf("r%d", i+1)}
		if name, rest, ok := strings.Cut(part, "="); ok {
			r.name, part = strings.TrimSpace(name), rest
		}
		if rest, ok := strings.CutPrefix(part, "cluster:"); ok {
			r.cluster, part = true, rest
		}
		for _, a := range strings.Split(part, ",") {
			if a = strings.TrimSpace(a); a != "" {
				r.addrs = append(r.addrs, a)
			}
		}
		r.cluster = r.cluster || len(r.addrs) > 1
		if err := r.check(names); err != nil {
			return nil, err
		}
		names[r.name] = true
		out = append(out, r)
	}
	return out, nil
}

// check refuses a region without an address, or whose name is taken or
// not one a Caddy config accepts.
func (r region) check(taken map[string]bool) error {
	switch {
	case len(r.addrs) == 0:
		return fmt.Errorf("region %q: no address", r.name)
	case taken[r.name]:
		return fmt.Errorf("region %q named twice", r.name)
	case r.name == "" || len(r.name) > 32 || strings.Trim(r.name, "abcdefghijklmnopqrstuvwxyz0123456789_-") != "":
		return fmt.Errorf("region name %q: want 1 to 32 characters of a-z, 0-9, '_' and '-'", r.name)
	}
	for _, a := range r.addrs {
		if !strings.Contains(a, ":") {
			return fmt.Errorf("region %q: address %q: want host:port", r.name, a)
		}
	}
	return nil
}

// options are the Redis options of r for an instance, with the run's key
// prefix.
func (r region) options(c config, prefix string) limiter.RedisOptions {
	return limiter.RedisOptions{Addresses: r.addrs, Cluster: r.cluster, KeyPrefix: prefix, Timeout: c.timeout}
}

// syncInterval is the Request.Sync of the run's zone: -sync in mode sync,
// else 0 (exact in Redis).
func (c config) syncInterval() time.Duration {
	if c.mode == modeSync {
		return c.sync
	}
	return 0
}
