package ratelimit

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// listedZone is the entry of zone in GET /rate_limit/zones.
func listedZone(t *testing.T, zone string) map[string]any {
	t.Helper()
	var list []map[string]any
	if err := json.Unmarshal([]byte(mustAdmin(t, "GET", "/rate_limit/zones", "")), &list); err != nil {
		t.Fatal(err)
	}
	for _, z := range list {
		if z["name"] == zone {
			return z
		}
	}
	t.Fatalf("zone %s is not listed", zone)
	return nil
}

// lookup is POST /rate_limit/zones/<zone>/lookup of key, decoded.
func lookup(t *testing.T, zone, key string) map[string]any {
	t.Helper()
	var u map[string]any
	out := mustAdmin(t, "POST", "/rate_limit/zones/"+zone+"/lookup", `{"key":"`+key+`"}`)
	if err := json.Unmarshal([]byte(out), &u); err != nil {
		t.Fatal(err)
	}
	return u
}

// field is v[name] as JSON, "" when absent.
func field(v map[string]any, name string) string {
	x, ok := v[name]
	if !ok {
		return ""
	}
	b, _ := json.Marshal(x)
	return string(b)
}

// TestAdminShowsOverridesInForce: under a zone override of 5 a day on a
// zone of 20 a day, GET /rate_limit/zones shows the limit in force, the
// config's and the override; a lookup of a key with its own override of
// 100 a day says what that client's headers say, and which overrides
// apply; in memory and in Redis. (Token buckets of a day refill one token
// in 14 minutes at the least: the figures do not move during the test.)
func TestAdminShowsOverridesInForce(t *testing.T) {
	stores := map[string]*RedisConfig{"memory": nil,
		"redis": {Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("adm%x:", rand.Uint64())}}
	for store, redis := range stores {
		t.Run(store, func(t *testing.T) {
			h, zone := overrideZone(t, &Zone{Rate: "20r/d"}, redis)
			mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone, `{"rate":"5r/d","expires_in":"1h"}`)
			z := listedZone(t, zone)
			if field(z, "limit") != "5" || field(z, "config_limit") != "20" || field(z, "policy") != `"5 requests per day"` ||
				!strings.Contains(field(z, "override"), `"rate":"5r/d"`) {
				t.Errorf("zone listed as %v; want limit 5, config_limit 20, the override's policy and the override", z)
			}
			mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"vip","rate":"100r/d"}`)
			var w *http.Response
			for range 30 {
				w = serve(h, keyRequest("vip")).Result()
			}
			limit, remaining := w.Header.Get("X-Ratelimit-Limit"), w.Header.Get("X-Ratelimit-Remaining")
			if limit != "100" || remaining != "70" {
				t.Fatalf("vip's headers say %s/%s; want 100/70", limit, remaining)
			}
			u := lookup(t, zone, "vip")
			if field(u, "limit") != limit || field(u, "remaining") != remaining || field(u, "config_limit") != "20" ||
				!strings.Contains(field(u, "zone_override"), `"rate":"5r/d"`) || !strings.Contains(field(u, "key_override"), `"rate":"100r/d"`) {
				t.Errorf("lookup of vip: %v; want the headers' %s/%s, config_limit 20 and both overrides", u, limit, remaining)
			}
			passes(h, "plain", 2)
			u = lookup(t, zone, "plain")
			if field(u, "limit") != "5" || field(u, "remaining") != "3" || field(u, "key_override") != "" {
				t.Errorf("lookup of plain: %v; want 5/3 under the zone's override alone", u)
			}
		})
	}
}

// TestAdminLookupBlockedAndExempt: a lookup of a blocked key says so, with
// what its refusals' headers say (nothing left until the block ends); one
// of an exempt key says that the zone does not count it.
func TestAdminLookupBlockedAndExempt(t *testing.T) {
	h, zone := overrideZone(t, &Zone{Rate: "20r/d"}, nil)
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"bad","block":true,"expires_in":"1h"}`)
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"free","exempt":true}`)
	w := serve(h, keyRequest("bad"))
	u := lookup(t, zone, "bad")
	if field(u, "blocked") != "true" || field(u, "remaining") != "0" || field(u, "reset") != w.Header().Get("X-Ratelimit-Reset") {
		t.Errorf("lookup of a blocked key: %v; want blocked, 0 left, reset %s as its 429 says", u, w.Header().Get("X-Ratelimit-Reset"))
	}
	if u = lookup(t, zone, "free"); field(u, "exempt") != "true" {
		t.Errorf("lookup of an exempt key: %v; want exempt", u)
	}
	mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone, `{"disabled":true}`)
	if z := listedZone(t, zone); field(z, "disabled") != "true" || field(z, "limit") != "20" {
		t.Errorf("a disabled zone listed as %v; want disabled, and its config's limit", z)
	}
	if u = lookup(t, zone, "free"); field(u, "disabled") != "true" {
		t.Errorf("lookup in a disabled zone: %v; want disabled", u)
	}
}

// TestAdminLookupBanned: a lookup of a banned client says it is banned and
// until when, as its refusals do, in memory and in Redis.
func TestAdminLookupBanned(t *testing.T) {
	stores := map[string]*RedisConfig{"memory": nil,
		"redis": {Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("admban%x:", rand.Uint64())}}
	for store, redis := range stores {
		t.Run(store, func(t *testing.T) {
			ban := &BanConfig{After: 2, Within: caddy.Duration(time.Minute), For: caddy.Duration(time.Hour)}
			h, zone := overrideZone(t, &Zone{Rate: "2r/d", Ban: ban}, redis)
			if u := lookup(t, zone, "bad"); field(u, "banned") != "" {
				t.Fatalf("lookup of a client never refused: %v; want no ban", u)
			}
			var w *http.Response
			for range 6 {
				w = serve(h, keyRequest("bad")).Result()
			}
			if w.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("status %d after 6 requests; want 429", w.StatusCode)
			}
			var refusal map[string]any
			if err := json.NewDecoder(w.Body).Decode(&refusal); err != nil || refusal["banned"] != true {
				t.Fatalf("refusal %v (%v); want a ban's", refusal, err)
			}
			u := lookup(t, zone, "bad")
			if field(u, "banned") != "true" || field(u, "remaining") != "0" || field(u, "banned_until") != field(refusal, "banned_until") {
				t.Errorf("lookup of a banned client: %v; want banned, 0 left, banned_until %v as its refusal says", u, refusal["banned_until"])
			}
			if u := lookup(t, zone, "good"); field(u, "banned") != "" {
				t.Errorf("lookup of another client: %v; want no ban", u)
			}
		})
	}
}
