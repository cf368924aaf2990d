package ratelimit

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// caddy-ratelimit's distributed mode: its zones shared by the instances
// that use one storage, approximately. Here every zone of a handler with
// distributed syncs (see Zone.Sync): through the redis block when there is
// one (every zone that can sync does, every interval of the two; the
// others stay exact), else through the storage (Handler.Storage, or
// Caddy's), where each instance writes its counts to a file of its own
// and reads the others' (package limiter/fleetsync). A zone in
// caddy-ratelimit's spelling (events in a window, the sliding log) counts
// with the sliding window counter, which can sync.

// Distributed has every zone of the handler sync, as caddy-ratelimit's
// distributed does: each instance decides on its own and shares its counts
// with the others every so often. With a redis block, through Redis: the
// zones sync every min(write_interval, read_interval) (see Zone.Sync);
// without, through the storage (the handler's storage, else Caddy's):
// fixed_window and sliding_window_counter zones only.
type Distributed struct {
	// WriteInterval is how often an instance writes its counts to the
	// storage. Default: 5s.
	WriteInterval caddy.Duration `json:"write_interval,omitempty"`
	// ReadInterval is how often an instance reads the others' counts from
	// the storage. Default: 5s.
	ReadInterval caddy.Duration `json:"read_interval,omitempty"`
	// PurgeAge deletes the storage's files of instances that did not
	// write for so long. Default: a file is deleted once its counts have
	// all faded. With a redis block, nothing to purge: Redis expires the
	// counts.
	PurgeAge caddy.Duration `json:"purge_age,omitempty"`
	// KeySecret is the fleet's secret: at least 16 characters, the same
	// on every instance; a placeholder such as {env.RATE_LIMIT_KEY_SECRET}
	// is resolved at load. Each instance signs its file in the storage
	// with it (HMAC-SHA-256), and ignores the files not signed with it,
	// so that whoever can write the storage but does not know it can
	// neither lift nor lower the limits by writing files (deleting or
	// overwriting one lowers them for a while: the others take its
	// instance's share as spent until they would purge it); and it keys the
	// digests of client keys in the files (HMAC-SHA-256), as the redis
	// block's key_secret does in Redis, so that whoever reads the storage
	// cannot test guesses of client keys (an IPv4 address is one of 2^32).
	// Default: none (files unsigned, a warning at load; plain SHA-256).
	// Not with a redis block, whose key_secret applies.
	KeySecret string `json:"key_secret,omitempty"`
}

// defaultDistributedInterval is caddy-ratelimit's read and write interval.
const defaultDistributedInterval = 5 * time.Second

// intervals are the write and read intervals with their defaults.
func (d *Distributed) intervals() (write, read time.Duration) {
	return cmp.Or(time.Duration(d.WriteInterval), defaultDistributedInterval), cmp.Or(time.Duration(d.ReadInterval), defaultDistributedInterval)
}

// check checks the intervals and the purge age.
func (d *Distributed) check() error {
	write, read := d.intervals()
	for _, iv := range []struct {
		name string
		d    time.Duration
	}{{"write_interval", write}, {"read_interval", read}} {
		if iv.d < minSync || iv.d > maxSync {
			return fmt.Errorf("distributed: %s %s: want an interval from %s to %s, such as 5s", iv.name, iv.d, minSync, maxSync)
		}
	}
	if write > 4*read {
		return fmt.Errorf("distributed: write_interval %s: at most four read_interval (%s): each instance estimates what the others "+
			"admitted since their last write from what it admitted itself, over its last reads", write, 4*read)
	}
	if least := max(2*write, 10*time.Second); d.PurgeAge < 0 || d.PurgeAge > 0 && time.Duration(d.PurgeAge) < least {
		return fmt.Errorf("distributed: purge_age %s: want at least %s (two write_interval, ten seconds at least), "+
			"or none: a live instance's file would be deleted between its writes", time.Duration(d.PurgeAge), least)
	}
	return nil
}

// sync is the interval of the zones' sync: with Redis, the shorter of the
// two (a round writes and reads at once); through a storage, a write and
// a read (what the others admitted takes that long to be seen), at most
// maxSync.
func (d *Distributed) sync(redis bool) time.Duration {
	write, read := d.intervals()
	if redis {
		return min(write, read)
	}
	return min(write+read, maxSync)
}

// provisionDistributed gives the zones of a handler with distributed their
// sync and their algorithm, and loads the storage they sync through
// without Redis; without distributed, a storage is only noted.
func (h *Handler) provisionDistributed(ctx caddy.Context) error {
	if h.Distributed == nil {
		if !isNull(h.Storage) {
			h.logger.Warn("storage has no effect without distributed: the zones are not shared through it")
		}
		return nil
	}
	err := h.Distributed.check()
	if err != nil {
		return err
	}
	if h.Redis != nil && !isNull(h.Storage) {
		return fmt.Errorf("storage: with a redis block, the zones of distributed share their counts in Redis; leave storage out")
	}
	if h.Redis != nil && h.Distributed.KeySecret != "" {
		return fmt.Errorf("distributed: key_secret: with a redis block, set key_secret in the redis block")
	}
	for _, z := range h.Zones {
		if z == nil {
			continue
		}
		if z.Algorithm == "" && z.MaxEvents != 0 { // the sliding log cannot sync
			z.Algorithm = limiter.SlidingWindowCounter.String()
		}
		z.distributed, z.viaStorage = h.Distributed.sync(h.Redis != nil), h.Redis == nil
	}
	if h.Redis != nil {
		return nil
	}
	if h.storageKey, err = resolveKeySecret("distributed", h.Distributed.KeySecret); err != nil {
		return err
	}
	st, label, err := h.loadStorage(ctx)
	if err != nil {
		return err
	}
	h.storage, h.storageLabel = st, label
	if h.storageKey == "" {
		h.logger.Warn("distributed without key_secret: the instances' files in the storage are not signed, so anyone who can write "+
			"rate_limit/sync in the storage can raise the limits (up to one limit per instance), lower them, or refuse any client; "+
			"set key_secret, the same on every instance", zap.String("storage", label))
	}
	return nil
}

// loadStorage loads the storage of distributed without Redis: the
// handler's storage module, else Caddy's; and its label, which names it in
// logs and metrics.
func (h *Handler) loadStorage(ctx caddy.Context) (certmagic.Storage, string, error) {
	if isNull(h.Storage) {
		st := caddyStorage(ctx)
		if st == nil {
			st = caddy.DefaultStorage // what a config without storage gets
		}
		return st, storageLabel(st), nil
	}
	mod, err := ctx.LoadModule(h, "Storage")
	if err != nil {
		if strings.Contains(err.Error(), "caddy.storage.redis") {
			return nil, "", storageRedisError(h.Storage)
		}
		return nil, "", fmt.Errorf("storage: %w", err)
	}
	conv, ok := mod.(caddy.StorageConverter)
	if !ok {
		return nil, "", fmt.Errorf("storage: module %T is not a storage", mod)
	}
	st, err := conv.CertMagicStorage()
	if err != nil {
		return nil, "", fmt.Errorf("storage: %w", err)
	}
	return st, storageLabel(st), nil
}

// caddyStorage is Caddy's storage, nil in a context without a config
// (caddy validate's, a test's), whose Storage panics.
func caddyStorage(ctx caddy.Context) (st certmagic.Storage) {
	defer func() { _ = recover() }()
	return ctx.Storage()
}

// storageLabel names a storage: its own description (Caddy's file system
// storage: "FileStorage:<path>"), else its type.
func storageLabel(st certmagic.Storage) string {
	if s, ok := st.(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprintf("%T", st)
}

// storagePoolKey names the store of a storage and distributed's intervals
// in stores: the handlers that share both share the store, across reloads.
func (h *Handler) storagePoolKey() string {
	write, read := h.Distributed.intervals()
	id := fmt.Sprintf("%s\x00%s\x00%d %d %d", h.storageLabel, h.Storage, write, read, h.Distributed.PurgeAge)
	if h.storageKey != "" { // its files are signed with it: another secret, another fleet
		sum := sha256.Sum256([]byte(h.storageKey))
		id += "\x00secret " + hex.EncodeToString(sum[:8])
	}
	if _, ok := h.storage.(fmt.Stringer); !ok {
		id += fmt.Sprintf("\x00%p", h.storage) // no description: this storage alone
	}
	sum := sha256.Sum256([]byte(id))
	return "storage:" + hex.EncodeToString(sum[:16])
}

// provisionStorage acquires the store of the storage distributed syncs
// through.
func (h *Handler) provisionStorage() error {
	write, read := h.Distributed.intervals()
	st, label := h.storage, h.storageLabel
	return h.loadStore(h.storagePoolKey(), func() (caddy.Destructor, error) {
		s := newSharedLimiter("")
		s.namespace = label
		return s.made(limiter.New(limiter.Config{Storage: fleetStorage(st), Sync: s, Overrides: overrideEvents{s},
			StorageOptions: limiter.StorageOptions{WriteEvery: write, ReadEvery: read, PurgeAge: time.Duration(h.Distributed.PurgeAge),
				Events: storageEvents{s}, Read: countSync, Secret: h.storageKey}}))
	})
}

// fleetStorage is st as the fleet reads it: telling its files' sizes
// (limiter.Sizer), so that none too large is read, and, when st is a file
// system (file_system), its files' paths (limiter.FileSystem), so that the
// fleet reads only regular files, each with a byte limit, and follows a
// symlinked directory.
func fleetStorage(st certmagic.Storage) limiter.Storage {
	if fsys, ok := st.(limiter.FileSystem); ok {
		return fileSystemStorage{sizedStorage{st}, fsys}
	}
	return sizedStorage{st}
}

// sizedStorage is a Caddy storage that tells the fleet its files' sizes.
type sizedStorage struct{ certmagic.Storage }

// fileSystemStorage is a Caddy storage of the file system.
type fileSystemStorage struct {
	sizedStorage
	limiter.FileSystem
}

func (s sizedStorage) Size(ctx context.Context, key string) (int64, error) {
	info, err := s.Stat(ctx, key)
	return info.Size, err
}

// checkStorageZone refuses, in a handler that syncs through a storage, a
// zone that does not sync: each instance would limit it alone.
func (h *Handler) checkStorageZone(z *Zone) error {
	if h.Distributed == nil || h.Redis != nil {
		return nil
	}
	if a := z.policy.Algorithm; z.Sync == 0 || a != limiter.FixedWindow && a != limiter.SlidingWindowCounter {
		return fmt.Errorf("distributed without a redis block shares only fixed_window and sliding_window_counter zones "+
			"(and events in a window) through the storage; %s%s would be limited by each instance alone: add a redis block to share it, "+
			"or use one of them", z.policy.Algorithm, syncHint(z))
	}
	z.Sync = caddy.Duration(max(time.Duration(z.Sync), h.Distributed.sync(false))) // the others' admissions take that long to be seen
	return nil
}

// syncHint names the option that keeps z from syncing, when it is not
// its algorithm.
func syncHint(z *Zone) string {
	switch {
	case !z.policy.Algorithm.Syncs():
		return ""
	case z.Ban != nil:
		return " with ban"
	case z.settles():
		return " with count_status or cost_from_response"
	}
	return ""
}

// isNull reports whether a JSON field is absent or null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// storageRedisError is the error for caddy-storage-redis as the storage,
// which this build does not have: the redis block to write instead, filled
// from its settings.
func storageRedisError(storage json.RawMessage) error {
	var fields map[string]any
	_ = json.Unmarshal(storage, &fields) // not an object: no settings to carry over
	c := redisFromStorage(storageOptions(fields))
	var js bytes.Buffer
	enc := json.NewEncoder(&js)
	enc.SetEscapeHTML(false) // <host:port> as it is
	if err := enc.Encode(c); err != nil {
		return err
	}
	return fmt.Errorf("%s\nin JSON: \"redis\": %s", redisStorageError(c), bytes.TrimSpace(js.Bytes()))
}

// redisStorageError explains that caddy-storage-redis is not built in and
// shows c as a Caddyfile block.
func redisStorageError(c RedisConfig) string {
	return "storage redis: caddy-storage-redis is not built into this Caddy. Share the zones through Redis: " +
		"replace storage with\n\n" + c.caddyfile() + "\n\nin the rate_limit block"
}

// parseStorage parses caddy-ratelimit's storage <module> [<args...>] [{ ... }]:
// the storage module's own Caddyfile syntax; for caddy-storage-redis,
// which this build does not have, the error shows the redis block to
// write instead.
func parseStorage(d *caddyfile.Dispenser, h *Handler) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	name, at := d.Val(), d.Token()
	if _, err := caddy.GetModule("caddy.storage." + name); err != nil && name == "redis" {
		msg := redisStorageError(redisFromStorage(storageTokens(d)))
		d := caddyfile.NewDispenser([]caddyfile.Token{at}) // the error at storage's line
		d.Next()
		return d.Errf("%s", msg)
	}
	unm, err := caddyfile.UnmarshalModule(d, "caddy.storage."+name)
	if err != nil {
		return err
	}
	if _, ok := unm.(caddy.StorageConverter); !ok {
		return d.Errf("storage %s: not a storage module", name)
	}
	h.Storage = caddyconfig.JSONModuleObject(unm, "module", name, nil)
	return nil
}

// storageTokens reads caddy-storage-redis's options (storage redis
// [cluster|failover] { ... }) as the redis block's conversion takes them.
func storageTokens(d *caddyfile.Dispenser) map[string][]string {
	opts := map[string][]string{"module": {"redis"}}
	if d.NextArg() {
		opts["client_type"] = []string{d.Val()}
		for d.NextArg() {
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		opts[name] = d.RemainingArgs()
		for inner := d.Nesting(); d.NextBlock(inner); { // address { a b c }
			opts[name] = append(opts[name], append([]string{d.Val()}, d.RemainingArgs()...)...)
		}
	}
	return opts
}

// parseDistributed parses distributed [{ read_interval, write_interval,
// purge_age, key_secret }].
func parseDistributed(d *caddyfile.Dispenser, h *Handler) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	h.Distributed = new(Distributed)
	fields := map[string]*caddy.Duration{"read_interval": &h.Distributed.ReadInterval,
		"write_interval": &h.Distributed.WriteInterval, "purge_age": &h.Distributed.PurgeAge}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() == "key_secret" {
			if err := parseDistributedSecret(d, h.Distributed); err != nil {
				return err
			}
			continue
		}
		f, ok := fields[d.Val()]
		if !ok {
			return d.Errf("distributed: unrecognized subdirective %q: want read_interval, write_interval, purge_age or key_secret", d.Val())
		}
		name := d.Val()
		var err error
		*f, err = durationArg(d, 1, "distributed: "+name+" %q: want a duration such as 5s")
		if err != nil {
			return err
		}
	}
	return nil
}

// parseDistributedSecret parses key_secret <secret>: a secret without a
// placeholder is checked here, one with a placeholder at load.
func parseDistributedSecret(d *caddyfile.Dispenser, dist *Distributed) error {
	if err := oneArg(d, &dist.KeySecret); err != nil {
		return err
	}
	if s := dist.KeySecret; !strings.Contains(s, "{") && len(s) < minKeySecret {
		return d.Errf("distributed: key_secret: at least %d characters, not %d (a placeholder such as {env.RATE_LIMIT_KEY_SECRET} is resolved at load)", minKeySecret, len(s))
	}
	return nil
}

// storageOptions flattens a storage module's JSON fields to strings:
// a list field to its items, anything else to its text.
func storageOptions(fields map[string]any) map[string][]string {
	opts := make(map[string][]string, len(fields))
	for name, v := range fields {
		switch v := v.(type) {
		case []any:
			for _, item := range v {
				opts[name] = append(opts[name], fmt.Sprint(item))
			}
		case nil:
		default:
			opts[name] = []string{fmt.Sprint(v)}
		}
	}
	return opts
}

// redisFromStorage is the redis block equivalent to caddy-storage-redis's
// options.
func redisFromStorage(opts map[string][]string) RedisConfig {
	one := func(name string) string { return strings.Join(opts[name], " ") }
	c := RedisConfig{Addresses: opts["address"], Username: one("username"), MasterName: one("master_name")}
	if len(c.Addresses) == 0 {
		c.Addresses = hostPorts(opts["host"], opts["port"])
	}
	c.Cluster = one("client_type") == "cluster"
	if one("password") != "" {
		c.Password = "{env.REDIS_PASSWORD}" // the storage's password, never printed
	}
	c.DB, _ = strconv.Atoi(one("db"))
	if one("tls_enabled") == "true" {
		c.TLS = &RedisTLS{InsecureSkipVerify: one("tls_insecure") == "true"}
	}
	return c
}

// hostPorts pairs caddy-storage-redis's hosts and ports (one port for
// all hosts, or one each); its defaults are 127.0.0.1 and 6379.
func hostPorts(hosts, ports []string) []string {
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1"}
	}
	if len(ports) == 0 {
		ports = []string{"6379"}
	}
	addrs := make([]string, len(hosts))
	for i, h := range hosts {
		addrs[i] = h + ":" + ports[min(i, len(ports)-1)]
	}
	return addrs
}

// caddyfile writes c as a Caddyfile redis block (the options a storage
// can carry over).
func (c RedisConfig) caddyfile() string {
	lines := []string{"addresses " + strings.Join(c.Addresses, " ")}
	for _, o := range []struct {
		set  bool
		line string
	}{
		{c.Cluster, "cluster"}, {c.MasterName != "", "master_name " + c.MasterName},
		{c.Username != "", "username " + c.Username}, {c.Password != "", "password " + c.Password},
		{c.DB != 0, "db " + strconv.Itoa(c.DB)},
		{c.TLS != nil && !c.TLS.InsecureSkipVerify, "tls"},
		{c.TLS != nil && c.TLS.InsecureSkipVerify, "tls {\n\t\t\tinsecure_skip_verify\n\t\t}"},
	} {
		if o.set {
			lines = append(lines, o.line)
		}
	}
	return "\tredis {\n\t\t" + strings.Join(lines, "\n\t\t") + "\n\t}"
}
