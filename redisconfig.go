package ratelimit

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// RedisConfig says how to reach Redis. Addresses, username, password and
// master name may use placeholders such as {env.REDIS_PASSWORD}.
type RedisConfig struct {
	// Addresses are host:port of Redis. One address: a standalone server
	// (or a cluster, with Cluster set); several: Redis Cluster nodes; with
	// MasterName: Sentinel servers. Required.
	Addresses []string `json:"addresses,omitempty"`

	// Cluster treats a single address as a seed of Redis Cluster (several
	// addresses always mean a cluster).
	Cluster bool `json:"cluster,omitempty"`

	// MasterName is the name of the master monitored by Sentinel; with it,
	// Addresses are the Sentinels.
	MasterName string `json:"master_name,omitempty"`

	// Username and Password authenticate to Redis (ACL or requirepass).
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`

	// DB is the database number (standalone and Sentinel only). Default: 0.
	DB int `json:"db,omitempty"`

	// TLS, when set, connects with TLS.
	TLS *RedisTLS `json:"tls,omitempty"`

	// KeyPrefix starts every Redis key of the limiter; it must not contain
	// { or }. Default: "rl:".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// KeySecret, a secret of at least 16 characters shared by every Caddy
	// instance of the fleet, keys the digest that names a client's buckets
	// in Redis (HMAC-SHA-256 instead of SHA-256). Without it, anyone can
	// compute which Redis Cluster hash slot a client key lands in, and so
	// choose keys (API keys, addresses) that all land on one shard, to load
	// it alone. Changing it starts every bucket afresh. It may use
	// placeholders such as {env.RL_KEY_SECRET}; one that resolves to
	// nothing is an error. Default: none (SHA-256).
	KeySecret string `json:"key_secret,omitempty"`

	// PoolSize is the largest number of connections per Redis node.
	// Default: 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// Timeout is the longest a decision waits on Redis (connection, command
	// and reply); after it, on_store_error applies. Default: 100ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// LocalCache is how many clients refused by Redis this instance
	// remembers, to refuse their next requests without asking Redis until
	// they could pass (at most 5s, so that a reset through the admin API
	// of another instance reaches this one soon): a client hammering past
	// its limit costs no Redis calls. 0 means the default, 10000; -1 turns
	// it off.
	LocalCache int `json:"local_cache,omitempty"`
}

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	// CA is a PEM file of the certificate authorities that sign the
	// servers' certificates. Default: the system's roots.
	CA string `json:"ca,omitempty"`
	// Cert and Key are PEM files of a client certificate and its key, for
	// servers that require one.
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// ServerName is the name expected in the servers' certificates.
	// Default: the host of each address.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// localCacheSize is the size of the cache of refused clients: n, or the
// default for 0, or none for -1.
func localCacheSize(n int) int {
	if n == 0 {
		return defaultLocalCache
	}
	return max(n, 0)
}

// defaultLocalCache is RedisConfig.LocalCache when unset.
const defaultLocalCache = 10000

// localCacheMaxAge bounds how long a refusal is answered locally.
const localCacheMaxAge = 5 * time.Second

// minKeySecret is the shortest RedisConfig.KeySecret.
const minKeySecret = 16

// keyHasher is the hasher of the client keys' digests: keyed by KeySecret
// when set, else nil (SHA-256); without Redis, the process's own
// (bucket.ProcessKeyHasher: digests of the memory store alone).
func (c *RedisConfig) keyHasher() (*limiter.KeyHasher, error) {
	if c == nil { // the memory store alone: its digests never leave the process
		return bucket.ProcessKeyHasher, nil
	}
	return sharedKeyHasher("redis", c.KeySecret)
}

// sharedKeyHasher is the hasher of digests that instances share (in Redis,
// or in a storage): keyed by secret, the option key_secret of block; plain
// SHA-256 without one.
func sharedKeyHasher(block, keySecret string) (*limiter.KeyHasher, error) {
	secret, err := resolveKeySecret(block, keySecret)
	if err != nil || secret == "" {
		return nil, err
	}
	return bucket.NewKeyHasher(secret), nil
}

// resolveKeySecret is keySecret, the option key_secret of block, with its
// placeholders resolved and checked; "" without one.
func resolveKeySecret(block, keySecret string) (string, error) {
	if keySecret == "" {
		return "", nil
	}
	// A placeholder that is unknown (a typo, or the Caddyfile's {$VAR} in
	// JSON) or empty is an error: it would leave a secret everyone can read.
	secret, err := caddy.NewReplacer().ReplaceOrErr(keySecret, true, true)
	switch {
	case err != nil:
		return "", fmt.Errorf("%s: key_secret %q: %w", block, keySecret, err)
	case secret == "":
		return "", fmt.Errorf("%s: key_secret %q resolves to nothing (an unset environment variable?)", block, keySecret)
	case len(secret) < minKeySecret:
		return "", fmt.Errorf("%s: key_secret: at least %d characters, not %d", block, minKeySecret, len(secret))
	}
	return secret, nil
}

// defaultRedisTimeout is RedisConfig.Timeout when unset.
const defaultRedisTimeout = 100 * time.Millisecond

// provisionRedis acquires the Redis store of h.Redis, shared by every
// handler with the same configuration (and regions).
func (h *Handler) provisionRedis() error {
	cfg, err := h.Redis.resolve()
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	files, err := cfg.TLS.read()
	if err != nil {
		return fmt.Errorf("redis: tls: %w", err)
	}
	key, err := cfg.poolKey(files)
	if err != nil {
		return err
	}
	var lc limiter.Config
	if lc.Redis, err = cfg.options(files); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if h.Regions != nil {
		rk, err := h.Regions.regionsKey()
		if err != nil {
			return err
		}
		key += rk
		if lc.Regions, err = h.Regions.limiterRegions(); err != nil {
			return err
		}
		lc.Regions.Fingerprint = h.regionFingerprint() // from the first mark
	}
	lc.LocalCache, lc.LocalCacheMaxAge = localCacheSize(cfg.LocalCache), localCacheMaxAge
	created := false
	err = h.loadStore(key, func() (caddy.Destructor, error) {
		created = true
		return newSharedRedis(cfg, lc)
	})
	if err == nil && created {
		h.checkRedis(time.Duration(cfg.Timeout))
	}
	if err == nil && h.Regions != nil {
		f := h.regionFingerprint()
		h.store.holdFingerprint(h, &f)
	}
	return err
}

// newSharedRedis makes the store of cfg, whose limiter is made of lc:
// Redis, whose nodes' breakers, rounds, links to other regions and
// overrides show in the metrics and logs.
func newSharedRedis(cfg RedisConfig, lc limiter.Config) (*sharedLimiter, error) {
	s := newSharedLimiter(strings.Join(cfg.Addresses, ",")) // the label outside a cluster
	s.namespace = overridesLabel(cfg, cfg.KeyPrefix)
	lc.Nodes, lc.Sync, lc.Overrides = s, s, overrideEvents{s}
	if lc.Regions != nil {
		lc.RegionEvents = regionEvents{s}
	}
	return s.made(limiter.New(lc))
}

// overridesLabel names the overrides of a Redis store: where they live
// (the addresses, sorted, then the db and key prefix when they are not the
// defaults) and, with key_secret, a fingerprint of it (the digests of keys
// depend on it): "10.0.1.2:6379,10.0.1.3:6379 db 1 prefix api: secret
// 5f1c2a9e". Stores that differ only in their connections (timeout, pool,
// TLS files) share the label, and their overrides.
func overridesLabel(cfg RedisConfig, prefix string) string {
	addrs := slices.Clone(cfg.Addresses)
	slices.Sort(addrs)
	label := strings.Join(addrs, ",")
	if cfg.DB != 0 {
		label += fmt.Sprintf(" db %d", cfg.DB)
	}
	if prefix != limiter.DefaultKeyPrefix {
		label += " prefix " + prefix
	}
	if cfg.KeySecret != "" {
		sum := sha256.Sum256([]byte(cfg.KeySecret))
		label += " secret " + hex.EncodeToString(sum[:4])
	}
	return label
}

// checkRedis warns when Redis does not answer at start; Caddy starts
// anyway and on_store_error applies until Redis answers.
func (h *Handler) checkRedis(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Second))
	defer cancel()
	err := h.store.Ping(ctx)
	switch {
	case err == nil:
	case limiter.AuthFailed(err):
		h.logger.Error("redis refuses the credentials at start (check username, password and the ACL user's permissions); on_store_error applies until it accepts them",
			zap.Strings("addresses", h.Redis.Addresses), zap.String("on_store_error", h.onError.Mode), zap.Error(err))
	default:
		h.logger.Warn("redis not reachable at start; on_store_error applies until it is",
			zap.Strings("addresses", h.Redis.Addresses), zap.String("on_store_error", h.onError.Mode), zap.Error(err))
	}
}

// resolve returns a copy of c with placeholders replaced, defaults set and
// values checked.
func (c *RedisConfig) resolve() (RedisConfig, error) {
	repl := caddy.NewReplacer()
	r := *c
	r.Addresses = make([]string, len(c.Addresses))
	for i, a := range c.Addresses {
		r.Addresses[i] = repl.ReplaceKnown(a, "")
	}
	r.MasterName = repl.ReplaceKnown(c.MasterName, "")
	r.Username = repl.ReplaceKnown(c.Username, "")
	r.Password = repl.ReplaceKnown(c.Password, "")
	for name, v := range map[string][2]string{"username": {c.Username, r.Username}, "password": {c.Password, r.Password}} {
		if v[0] != "" && v[1] == "" { // an unset {env.VAR}: not a config without one
			return r, fmt.Errorf("%s %q resolves to nothing (an unset environment variable?)", name, v[0])
		}
	}
	r.KeyPrefix = cmp.Or(c.KeyPrefix, limiter.DefaultKeyPrefix)
	r.Timeout = cmp.Or(c.Timeout, caddy.Duration(defaultRedisTimeout))
	return r, r.check()
}

func (c *RedisConfig) check() error {
	switch {
	case len(c.Addresses) == 0 || slices.Contains(c.Addresses, ""):
		return fmt.Errorf("addresses: at least one host:port, none empty")
	case c.Timeout < 0:
		return fmt.Errorf("timeout %s: must be positive", time.Duration(c.Timeout))
	case checkKeyPrefix(c.KeyPrefix) != nil:
		return checkKeyPrefix(c.KeyPrefix)
	case c.PoolSize < 0:
		return fmt.Errorf("pool_size %d: must be positive", c.PoolSize)
	case c.LocalCache < -1:
		return fmt.Errorf("local_cache %d: want a size, 0 (the default) or -1 (off)", c.LocalCache)
	case c.DB < 0:
		return fmt.Errorf("db %d: must be 0 or more", c.DB)
	case c.DB != 0 && (c.Cluster || len(c.Addresses) > 1) && c.MasterName == "":
		return fmt.Errorf("db %d: Redis Cluster has only db 0", c.DB)
	}
	return nil
}

// checkKeyPrefix refuses a key prefix with { or }: in a cluster, they
// would choose the hash slot of every key.
func checkKeyPrefix(prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("key_prefix %q must not contain { or } (they would choose the cluster slot)", prefix)
	}
	return nil
}

// limiterOptions are the limiter's options of c: resolved, its TLS
// files read.
func (c *RedisConfig) limiterOptions() (*limiter.RedisOptions, error) {
	cfg, err := c.resolve()
	if err != nil {
		return nil, err
	}
	files, err := cfg.TLS.read()
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return cfg.options(files)
}

// options are the limiter's options of c, with the TLS files' contents.
func (c *RedisConfig) options(files tlsFiles) (*limiter.RedisOptions, error) {
	o := &limiter.RedisOptions{Addresses: c.Addresses, Cluster: c.Cluster, MasterName: c.MasterName,
		Username: c.Username, Password: c.Password, DB: c.DB, PoolSize: c.PoolSize,
		Timeout: time.Duration(c.Timeout), KeyPrefix: c.KeyPrefix}
	if c.TLS != nil {
		tlsConfig, err := c.TLS.config(files)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		o.TLS = tlsConfig
	}
	return o, nil
}

// tlsFiles are the contents of the files a RedisTLS names, read once per
// provisioning: the TLS configuration and the pool key both come from
// them, so that files replaced on disk make a new pool on reload.
type tlsFiles struct {
	ca, cert, key []byte
}

// read reads the files t names; none without TLS.
func (t *RedisTLS) read() (tlsFiles, error) {
	var f tlsFiles
	if t == nil {
		return f, nil
	}
	if (t.Cert == "") != (t.Key == "") {
		return f, fmt.Errorf("cert and key go together")
	}
	for _, file := range []struct {
		name, path string
		data       *[]byte
	}{{"ca", t.CA, &f.ca}, {"cert", t.Cert, &f.cert}, {"key", t.Key, &f.key}} {
		if file.path == "" {
			continue
		}
		data, err := os.ReadFile(file.path)
		if err != nil {
			return f, fmt.Errorf("reading %s: %w", file.name, err)
		}
		*file.data = data
	}
	return f, nil
}

// config is the TLS configuration of t, with the certificates in files
// (read from t's files).
func (t *RedisTLS) config(files tlsFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CA != "" {
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(files.ca) {
			return nil, fmt.Errorf("ca %s: no PEM certificate found", t.CA)
		}
	}
	if t.Cert != "" {
		pair, err := tls.X509KeyPair(files.cert, files.key)
		if err != nil {
			return nil, fmt.Errorf("loading client certificate %s and key %s: %w", t.Cert, t.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// poolKey names the store of c in stores: handlers with the same
// resolved configuration and the same contents of its TLS files share one
// Redis client. Certificates replaced on disk change the key, so that a
// reload builds a client with them (the old one goes with the old
// handlers). The password and the files (a private key among them) enter
// the key only as part of a digest.
func (c *RedisConfig) poolKey(files tlsFiles) (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(b) // a JSON object: it ends where the files begin
	for _, f := range [][]byte{files.ca, files.cert, files.key} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(f))))
		h.Write(f)
	}
	return "redis:" + hex.EncodeToString(h.Sum(nil)), nil
}
