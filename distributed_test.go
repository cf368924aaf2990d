package ratelimit

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDistributedShowsRedis: the error shows the redis block equivalent
// to a Redis storage (caddy-storage-redis's fields), in the Caddyfile and
// in JSON, and never the storage's password.
func TestDistributedShowsRedis(t *testing.T) {
	storage := json.RawMessage(`{"module": "redis", "host": ["10.0.0.5", "10.0.0.6"], "port": ["6380"],
		"password": "hunter2", "db": 2, "username": "rl", "tls_enabled": true, "client_type": "cluster"}`)
	err := refuseDistributed(json.RawMessage(`{"read_interval": "5s"}`), storage)
	for _, want := range []string{
		"distributed: caddy-ratelimit's distributed",
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
