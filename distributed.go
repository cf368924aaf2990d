package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// caddy-ratelimit's distributed mode has each instance write its counts to
// Caddy's storage and read the others' every few seconds: an approximate,
// eventually consistent sum. It is refused here rather than accepted as
// something weaker: a fleet whose instances each limit alone would let
// through N times the limit while its operators believe in one limit. The
// error shows the redis block that shares one exact limit instead,
// filled from the storage's settings when the storage is a Redis
// (caddy-storage-redis: address, or host and port, username, password,
// db, client_type, master_name, tls_enabled, tls_insecure).

// refuseDistributed is the error for caddy-ratelimit's JSON distributed
// and storage fields, nil when neither is set.
func refuseDistributed(distributed, storage json.RawMessage) error {
	option := ""
	switch {
	case !isNull(distributed):
		option = "distributed"
	case !isNull(storage):
		option = "storage"
	default:
		return nil
	}
	var fields map[string]any
	_ = json.Unmarshal(storage, &fields) // not an object: no settings to carry over
	c := redisFromStorage(storageOptions(fields))
	var js bytes.Buffer
	enc := json.NewEncoder(&js)
	enc.SetEscapeHTML(false) // <host:port> as it is
	if err := enc.Encode(c); err != nil {
		return err
	}
	return fmt.Errorf("%s\nin JSON: \"redis\": %s", distributedError(option, c), bytes.TrimSpace(js.Bytes()))
}

// isNull reports whether a JSON field is absent or null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// distributedError explains why option is refused and shows c as a
// Caddyfile block.
func distributedError(option string, c RedisConfig) string {
	return option + ": caddy-ratelimit's distributed rate limiting (instances trading approximate counts " +
		"through storage) is not supported, and each instance limiting alone in its place would be a " +
		"silent downgrade. Share one exact limit through Redis: replace distributed and storage with\n\n" +
		c.caddyfile() + "\n\nin the rate_limit block"
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

// redisFromStorage is the redis block equivalent to a storage module's
// options; for a storage that is not a Redis, a template.
func redisFromStorage(opts map[string][]string) RedisConfig {
	one := func(name string) string { return strings.Join(opts[name], " ") }
	if one("module") != "redis" {
		return RedisConfig{Addresses: []string{"<host:port>"}}
	}
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
