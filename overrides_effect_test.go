package ratelimit

import (
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// agreed looks key up in h's zone, then sends a request of key, and
// checks that the request gets what the lookup said: refused when
// blocked, with the reset the lookup gave; passed uncounted when exempt;
// else the lookup's limit, with one less remaining. It returns the lookup.
func agreed(t *testing.T, h *Handler, zone, key string) map[string]any {
	t.Helper()
	u := lookup(t, zone, key)
	w := serve(h, keyRequest(key))
	limit, reset := w.Header().Get("X-Ratelimit-Limit"), w.Header().Get("X-Ratelimit-Reset")
	switch {
	case field(u, "blocked") == "true":
		if w.Code != http.StatusTooManyRequests || reset != field(u, "reset") {
			t.Errorf("%s, looked up as blocked until %s: %d, reset %q; want 429 until then", key, field(u, "reset"), w.Code, reset)
		}
	case field(u, "exempt") == "true":
		if w.Code != http.StatusOK || limit != "" {
			t.Errorf("%s, looked up as exempt: %d, limit %q; want 200, uncounted", key, w.Code, limit)
		}
	default:
		left, _ := strconv.Atoi(field(u, "remaining"))
		if w.Code != http.StatusOK || limit != field(u, "limit") || w.Header().Get("X-Ratelimit-Remaining") != strconv.Itoa(left-1) {
			t.Errorf("%s, looked up with %s of %s left: %d, %s of %s; want 200, one less of the same limit",
				key, field(u, "remaining"), field(u, "limit"), w.Code, w.Header().Get("X-Ratelimit-Remaining"), limit)
		}
	}
	return u
}

// putStored writes an override into h's store as another instance (or an
// earlier config) may have, past the admin API's checks of the zone:
// zone's own when key is "", else key's.
func putStored(t *testing.T, h *Handler, key string, o overrides.Override) {
	t.Helper()
	z := h.zones[0]
	var digest *[16]byte
	if key != "" {
		d := z.bucket(key).Digest()
		digest = &d
	}
	if err := h.store.overrides.Put(context.Background(), z.name, digest, o); err != nil {
		t.Fatal(err)
	}
}

// TestOverrideEffectAgrees: for each kind of override, what the admin API
// shows of a zone and of a key (the zones' listing, a lookup) is what the
// request path enforces: overrides.Effect computes both. A zone's rate and
// burst; a key's own limit; a block; an exemption; and the limits left
// out, where the zone's algorithm does not take them, and where the key's
// give a policy the zone refuses (the zone's alone applies). Token
// buckets of a day and leaky buckets of 10 s a request: nothing refills
// during a case.
func TestOverrideEffectAgrees(t *testing.T) {
	t.Run("zone rate and burst", func(t *testing.T) {
		h, zone := overrideZone(t, &Zone{Rate: "20r/d"}, nil)
		mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone, `{"rate":"5r/d","burst":7}`)
		z := listedZone(t, zone)
		if field(z, "limit") != "7" || field(z, "policy") != `"5 requests per day"` || field(z, "config_limit") != "20" {
			t.Errorf("zone listed as %v; want the override's 7 of 5 a day, the config's 20", z)
		}
		if u := agreed(t, h, zone, "a"); field(u, "limit") != field(z, "limit") || field(u, "policy") != field(z, "policy") {
			t.Errorf("lookup %v; want the listing's limit and policy", u)
		}
	})
	t.Run("key's own limit", func(t *testing.T) {
		h, zone := overrideZone(t, &Zone{Rate: "20r/d"}, nil)
		mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"vip","rate":"100r/d"}`)
		if u := agreed(t, h, zone, "vip"); field(u, "limit") != "100" || field(u, "key_override") == "" {
			t.Errorf("lookup of vip: %v; want its override's 100", u)
		}
		if u := agreed(t, h, zone, "plain"); field(u, "limit") != "20" || field(listedZone(t, zone), "limit") != "20" {
			t.Errorf("lookup of plain: %v; want the config's 20, as listed", u)
		}
	})
	t.Run("block", func(t *testing.T) {
		h, zone := overrideZone(t, &Zone{Rate: "20r/d"}, nil)
		mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"bad","block":true,"expires_in":"1h"}`)
		if u := agreed(t, h, zone, "bad"); field(u, "blocked") != "true" {
			t.Errorf("lookup of a blocked key: %v; want blocked", u)
		}
		if u := agreed(t, h, zone, "good"); field(u, "blocked") != "" {
			t.Errorf("lookup of another key: %v; want not blocked", u)
		}
	})
	t.Run("exempt", func(t *testing.T) {
		h, zone := overrideZone(t, &Zone{Rate: "20r/d"}, nil)
		mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone, `{"burst":3}`)
		mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"free","exempt":true}`)
		for range 5 {
			if u := agreed(t, h, zone, "free"); field(u, "exempt") != "true" || field(u, "limit") != field(listedZone(t, zone), "limit") {
				t.Fatalf("lookup of an exempt key: %v; want exempt, under the zone's limit as listed", u)
			}
		}
	})
	t.Run("left out: not the zone's algorithm", func(t *testing.T) {
		h, zone := overrideZone(t, &Zone{Rate: "20r/d"}, nil)
		putStored(t, h, "", overrides.Override{MaxConcurrent: 3})
		if l := listedZone(t, zone); field(l, "limit") != "20" || field(l, "override_left_out") == "" {
			t.Errorf("zone listed as %v; want the config's 20, the override left out", l)
		}
		if u := agreed(t, h, zone, "a"); field(u, "limit") != "20" {
			t.Errorf("lookup %v; want the config's 20", u)
		}
	})
	t.Run("left out: refused with the zone's", func(t *testing.T) {
		h, zone := overrideZone(t, &Zone{Rate: "1r/s", Algorithm: "leaky_bucket", Burst: "5"}, nil)
		mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone, `{"rate":"1r/10s"}`)
		putStored(t, h, "k", overrides.Override{Burst: 120}) // 20 minutes of wait: over maxLeakyWait
		if u := agreed(t, h, zone, "k"); field(u, "limit") != "6" || field(u, "policy") != `"1 request per 10 seconds"` {
			t.Errorf("lookup %v; want the zone's override alone, 5 waiting at 1 per 10 s", u)
		}
	})
}
