package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// TestStorageRedisShowsRedis: caddy-storage-redis as the storage (not
// built in) fails with the redis block equivalent to its fields, in the
// Caddyfile and in JSON, and never the storage's password.
func TestStorageRedisShowsRedis(t *testing.T) {
	storage := json.RawMessage(`{"module": "redis", "host": ["10.0.0.5", "10.0.0.6"], "port": ["6380"],
		"password": "hunter2", "db": 2, "username": "rl", "tls_enabled": true, "client_type": "cluster"}`)
	h := &Handler{Distributed: &Distributed{}, Storage: storage, Zones: map[string]*Zone{"a": {Key: "static", MaxEvents: 5, Window: 60e9}}}
	err := provision(t, h)
	for _, want := range []string{
		"storage redis: caddy-storage-redis is not built into this Caddy",
		"\tredis {\n\t\taddresses 10.0.0.5:6380 10.0.0.6:6380\n\t\tcluster\n\t\tusername rl\n\t\tpassword {env.REDIS_PASSWORD}\n\t\tdb 2\n\t\ttls\n\t}",
		`in JSON: "redis": {"addresses":["10.0.0.5:6380","10.0.0.6:6380"],"cluster":true,"username":"rl","password":"{env.REDIS_PASSWORD}","db":2,"tls":{}}`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error = %v\nwant it to contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("the storage's password is in the error: %v", err)
	}
}

// TestDistributedZones: distributed gives every zone that can sync its
// sync: with a redis block, every min(write, read) interval, a token
// bucket too, a concurrency limit staying exact; through a storage, every
// write and read, windows only. A zone in caddy-ratelimit's spelling counts
// with the sliding window counter. What cannot be shared fails to load,
// saying why.
func TestDistributedZones(t *testing.T) {
	redisAddr := redistest.StandaloneAddr(t)
	storage := func() json.RawMessage {
		return json.RawMessage(`{"module":"file_system","root":` + strconv.Quote(t.TempDir()) + `}`)
	}
	events := func() *Zone {
		return &Zone{Key: "{http.request.remote.host}", MaxEvents: 10, Window: caddy.Duration(time.Minute)}
	}
	d := &Distributed{WriteInterval: caddy.Duration(2 * time.Second), ReadInterval: caddy.Duration(3 * time.Second)}
	cases := []struct {
		name  string
		h     *Handler
		syncs map[string]time.Duration // zone: its sync
		err   string
	}{
		{"redis", &Handler{Distributed: d, Redis: &RedisConfig{Addresses: []string{redisAddr}},
			Zones: map[string]*Zone{"ev": events(), "tb": {Key: "k", Rate: "5r/s"}, "mc": {Key: "k", MaxConcurrent: 3}, "own": {Key: "k", Rate: "5r/s", Sync: caddy.Duration(time.Second)},
				"short": {Key: "k", MaxEvents: 2, Window: caddy.Duration(2 * time.Second)}, "tiny": {Key: "k", MaxEvents: 2, Window: caddy.Duration(10 * time.Millisecond)}}},
			map[string]time.Duration{"ev": 2 * time.Second, "tb": 2 * time.Second, "mc": 0, "own": time.Second, "short": time.Second, "tiny": 0}, ""},
		{"storage", &Handler{Distributed: d, Storage: storage(),
			Zones: map[string]*Zone{"ev": events(), "fw": {Key: "k", Rate: "5r/s", Algorithm: "fixed_window"}, "own": {Key: "k", Rate: "5r/s", Algorithm: "fixed_window", Sync: caddy.Duration(100 * time.Millisecond)}}},
			map[string]time.Duration{"ev": 5 * time.Second, "fw": 5 * time.Second, "own": 5 * time.Second}, ""},
		{"storage token bucket", &Handler{Distributed: d, Storage: storage(), Zones: map[string]*Zone{"tb": {Key: "k", Rate: "5r/s"}}}, nil,
			`zone "tb": distributed without a redis block shares only fixed_window and sliding_window_counter zones (and events in a window) through the storage; token_bucket would be limited by each instance alone: add a redis block to share it, or use one of them`},
		{"storage concurrency", &Handler{Distributed: d, Storage: storage(), Zones: map[string]*Zone{"mc": {Key: "k", MaxConcurrent: 3}}}, nil,
			`zone "mc": distributed without a redis block shares only`},
		{"storage log", &Handler{Distributed: d, Storage: storage(), Zones: map[string]*Zone{"log": {Key: "k", Rate: "5r/s", Algorithm: "sliding_window_log"}}}, nil,
			`sliding_window_log would be limited by each instance alone`},
		{"storage ban", &Handler{Distributed: d, Storage: storage(), Zones: map[string]*Zone{"b": {Key: "k", Rate: "5r/s", Algorithm: "fixed_window", Ban: &BanConfig{After: 3, Within: caddy.Duration(time.Minute), For: caddy.Duration(time.Hour)}}}}, nil,
			`fixed_window with ban would be limited by each instance alone: add a redis block to share it, or use one of them`},
		{"redis and storage", &Handler{Distributed: d, Storage: storage(), Redis: &RedisConfig{Addresses: []string{redisAddr}}, Zones: map[string]*Zone{"ev": events()}}, nil,
			"storage: with a redis block, the zones of distributed share their counts in Redis; leave storage out"},
		{"interval too short", &Handler{Distributed: &Distributed{ReadInterval: caddy.Duration(time.Millisecond)}, Storage: storage(), Zones: map[string]*Zone{"ev": events()}}, nil,
			"distributed: read_interval 1ms: want an interval from 10ms to 1h0m0s, such as 5s"},
		{"purge negative", &Handler{Distributed: &Distributed{PurgeAge: -1}, Storage: storage(), Zones: map[string]*Zone{"ev": events()}}, nil,
			"distributed: purge_age -1ns: want at least 10s (two write_interval, ten seconds at least), or none"},
		{"writes far apart", &Handler{Distributed: &Distributed{WriteInterval: caddy.Duration(5 * time.Second), ReadInterval: caddy.Duration(time.Second)}, Storage: storage(), Zones: map[string]*Zone{"ev": events()}}, nil,
			"distributed: write_interval 5s: at most four read_interval (4s)"},
		{"purge within writes", &Handler{Distributed: &Distributed{PurgeAge: caddy.Duration(time.Second)}, Storage: storage(), Zones: map[string]*Zone{"ev": events()}}, nil,
			"distributed: purge_age 1s: want at least 10s"},
		{"key_secret with redis", &Handler{Distributed: &Distributed{KeySecret: "0123456789abcdef"}, Redis: &RedisConfig{Addresses: []string{redisAddr}}, Zones: map[string]*Zone{"ev": events()}}, nil,
			"distributed: key_secret: with a redis block, set key_secret in the redis block"},
		{"key_secret short", &Handler{Distributed: &Distributed{KeySecret: "short"}, Storage: storage(), Zones: map[string]*Zone{"ev": events()}}, nil,
			"distributed: key_secret: at least 16 characters, not 5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := provision(t, c.h)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("provision = %v\nwant an error containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range c.syncs {
				z := c.h.Zones[name]
				if time.Duration(z.Sync) != want {
					t.Errorf("zone %s: sync %s, want %s", name, time.Duration(z.Sync), want)
				}
				if name == "ev" && z.policy.Algorithm != limiter.SlidingWindowCounter {
					t.Errorf("zone ev counts with %s, want sliding_window_counter", z.policy.Algorithm)
				}
			}
		})
	}
}

// TestDistributedStorageUntrusted: through Caddy's file_system storage, a
// file of rate_limit/sync that is a symlink to /dev/zero is skipped (the
// instance starts, its memory whole), and rate_limit/sync a symlink to a
// shared directory is followed: the instance counts the other whose file
// is there.
func TestDistributedStorageUntrusted(t *testing.T) {
	other, _ := json.Marshal(map[string]any{"v": 1, "instance": "00000000000000cc", "at": time.Now().UnixNano(), "until": time.Now().UnixNano(), "buckets": []any{}})
	for _, linked := range []bool{false, true} {
		t.Run(fmt.Sprintf("linked %v", linked), func(t *testing.T) {
			root, shared := t.TempDir(), t.TempDir()
			if err := os.Mkdir(filepath.Join(root, "rate_limit"), 0o700); err != nil {
				t.Fatal(err)
			}
			sub := filepath.Join(root, "rate_limit", "sync")
			if linked {
				if err := os.Symlink(shared, sub); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Mkdir(sub, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/dev/zero", filepath.Join(sub, "00000000000000aa.json")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(sub, "00000000000000cc.json"), other, 0o600); err != nil {
				t.Fatal(err)
			}
			h := &Handler{Distributed: &Distributed{}, Storage: json.RawMessage(`{"module":"file_system","root":` + strconv.Quote(root) + `}`),
				Zones: map[string]*Zone{"fw": {Key: "k", Rate: "5r/s", Algorithm: "fixed_window"}}}
			if err := provision(t, h); err != nil {
				t.Fatal(err)
			}
			if n := h.store.Limiter.CountSync(context.Background(), time.Second); n != 2 {
				t.Errorf("the instance counts %d instances, want 2 (itself and the other's file)", n)
			}
		})
	}
}

// TestDistributedKeySecretCaddyfile: distributed's key_secret takes one
// secret of at least 16 characters, checked as the Caddyfile adapts when
// it has no placeholder (the error at its line); a placeholder is kept
// for the load to resolve.
func TestDistributedKeySecretCaddyfile(t *testing.T) {
	src := func(line string) string {
		return ":8080 {\n\trate_limit {\n\t\tdistributed {\n\t\t\t" + line + "\n\t\t}\n\t\tzone z {\n\t\t\tevents 5\n\t\t\twindow 1m\n\t\t}\n\t}\n}\n"
	}
	for _, c := range []struct{ name, line, want string }{
		{"none", "key_secret", "wrong argument count or unexpected line ending after 'key_secret', at Caddyfile:4"},
		{"two", "key_secret 0123456789abcdef more", "wrong argument count or unexpected line ending after 'more', at Caddyfile:4"},
		{"short", "key_secret short", "distributed: key_secret: at least 16 characters, not 5 (a placeholder such as {env.RATE_LIMIT_KEY_SECRET} is resolved at load), at Caddyfile:4"},
		{"empty", `key_secret ""`, "distributed: key_secret: at least 16 characters, not 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := adapt(t, src(c.line)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
	for _, secret := range []string{"0123456789abcdef", "{env.RL_FLEET_SECRET}"} {
		out, err := adapt(t, src("key_secret "+secret))
		if want := `"distributed":{"key_secret":` + strconv.Quote(secret) + `}`; err != nil || !strings.Contains(out, want) {
			t.Fatalf("key_secret %s: %v\n%s\nwant %s", secret, err, out, want)
		}
	}
}

// TestDistributedSigned: through Caddy's file_system storage, in JSON,
// with key_secret from an environment variable, the instance's file is
// signed and another's file that is not is no instance; without
// key_secret, that file counts, and a warning at load says the storage's
// writers can lift or lower the limits. A key_secret that resolves to
// nothing or is short fails to load.
func TestDistributedSigned(t *testing.T) {
	t.Setenv("RL_FLEET_SECRET", "0123456789abcdef-fleet")
	other, _ := json.Marshal(map[string]any{"v": 1, "instance": "00000000000000cc", "at": time.Now().UnixNano(), "until": time.Now().UnixNano(), "buckets": []any{}})
	for _, secret := range []string{"", "{env.RL_FLEET_SECRET}"} {
		t.Run(fmt.Sprintf("secret %q", secret), func(t *testing.T) {
			root := t.TempDir()
			sub := filepath.Join(root, "rate_limit", "sync")
			if err := os.MkdirAll(sub, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(sub, "00000000000000cc.json"), other, 0o600); err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.WarnLevel)
			h := &Handler{Distributed: &Distributed{KeySecret: secret}, Storage: json.RawMessage(`{"module":"file_system","root":` + strconv.Quote(root) + `}`),
				Zones: map[string]*Zone{"fw": {Key: "k", Rate: "5r/s", Algorithm: "fixed_window"}}, logger: zap.New(core)}
			if err := provision(t, h); err != nil {
				t.Fatal(err)
			}
			n, warned := h.store.Limiter.CountSync(context.Background(), time.Second), logs.FilterMessageSnippet("without key_secret").Len()
			files, _ := filepath.Glob(filepath.Join(sub, "*.json"))
			signed := 0
			for _, f := range files {
				if b, _ := os.ReadFile(f); strings.Contains(string(b), `"mac":"`) {
					signed++
				}
			}
			want := map[bool][3]int{false: {2, 1, 0}, true: {1, 0, 1}}[secret != ""] // instances, warnings, signed files
			if got := [3]int{n, warned, signed}; got != want {
				t.Fatalf("instances counted, warnings, signed files: %v, want %v", got, want)
			}
		})
	}
	for secret, want := range map[string]string{
		"{env.RL_UNSET_FLEET_SECRET}": `distributed: key_secret "{env.RL_UNSET_FLEET_SECRET}"`,
		"short":                       "distributed: key_secret: at least 16 characters, not 5",
	} {
		h := &Handler{Distributed: &Distributed{KeySecret: secret}, Storage: json.RawMessage(`{"module":"file_system","root":` + strconv.Quote(t.TempDir()) + `}`),
			Zones: map[string]*Zone{"fw": {Key: "k", Rate: "5r/s", Algorithm: "fixed_window"}}}
		if err := provision(t, h); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("key_secret %s: provision = %v, want an error containing %q", secret, err, want)
		}
	}
}
