package ratelimit

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
)

func TestCaddyfileAdapts(t *testing.T) {
	out, err := adapt(t, `:8080 {
	rate_limit {
		zone api {
			match {
				path /api/*
			}
			key   {http.request.header.X-API-Key}
			rate  100r/m
			burst 20
		}
		zone per_ip {
			key  {client_ip}
			rate 5r/s
		}
	}
	respond "ok"
}`)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []json.RawMessage `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatal(err)
	}
	var handlers []string
	for _, srv := range cfg.Apps.HTTP.Servers {
		for _, r := range srv.Routes {
			for _, h := range r.Handle {
				handlers = append(handlers, string(h))
			}
		}
	}
	want := `{"handler":"rate_limit","zones":{"api":{"match":[{"path":["/api/*"]}],"key":"{http.request.header.X-API-Key}","rate":"100r/m","burst":20},"per_ip":{"key":"{http.vars.client_ip}","rate":"5r/s"}}}`
	found := false
	for _, h := range handlers {
		found = found || sameJSON(t, h, want)
	}
	if !found {
		t.Fatalf("rate_limit handler not found as\n%s\nin\n%s", want, out)
	}
	// Ordered before respond without a global order option.
	if !strings.Contains(handlers[0], `"handler":"rate_limit"`) {
		t.Fatalf("rate_limit is not the first handler: %v", handlers)
	}
}

func sameJSON(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

func TestCaddyfileOrderedBeforeBasicAuth(t *testing.T) {
	out, err := adapt(t, `:8080 {
	reverse_proxy 127.0.0.1:9
	basic_auth {
		bob $2a$14$Zkx19XLiW6VYouLHR5NmfOFU0z2GTNmpkT/5qqR7hx4IjWJPDhjvG
	}
	rate_limit {
		zone z {
			key {client_ip}
			rate 1r/s
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	rl, auth, proxy := strings.Index(out, `"rate_limit"`), strings.Index(out, `"authentication"`), strings.Index(out, `"reverse_proxy"`)
	if rl < 0 || auth < 0 || proxy < 0 || !(rl < auth && auth < proxy) {
		t.Fatalf("want rate_limit < basic_auth < reverse_proxy, got positions %d %d %d in\n%s", rl, auth, proxy, out)
	}
}

func TestCaddyfileErrors(t *testing.T) {
	zone := func(body string) string {
		return ":8080 {\n\trate_limit {\n\t\tzone api {\n" + body + "\n\t\t}\n\t}\n}\n"
	}
	cases := []struct {
		name, src, want string
	}{
		{"duplicate zone", ":8080 {\n\trate_limit {\n\t\tzone a {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t\tzone a {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t}\n}", `duplicate zone "a", at Caddyfile:7`},
		{"skip without key", zone("\t\t\trate 1r/s\n\t\t\ton_empty_key skip"), `zone "api": on_empty_key skip needs a key: without one, the zone has a single bucket, at Caddyfile:5`},
		{"missing rate", zone("\t\t\tkey {client_ip}"), `zone "api": rate (or max_concurrent) is required, at Caddyfile:3`},
		// An error about two options points at the second of them.
		{"rate after max_concurrent", zone("\t\t\tmax_concurrent 5\n\t\t\tkey k\n\t\t\trate 1r/s"), `nodelay and ban do not apply, at Caddyfile:6`},
		{"algorithm after nodelay", zone("\t\t\trate 1r/s\n\t\t\tnodelay\n\t\t\talgorithm fixed_window\n\t\t\tkey k"), `zone "api": nodelay applies to leaky_bucket only, at Caddyfile:6`},
		{"burst before rate", zone("\t\t\tkey k\n\t\t\talgorithm fixed_window\n\t\t\tburst 5\n\t\t\trate 10r/s"), `its limit is N of the rate per window, at Caddyfile:6`},
		{"log over its cap, key last", zone("\t\t\trate 20000r/s\n\t\t\talgorithm sliding_window_log\n\t\t\tkey k"), `use sliding_window_counter, at Caddyfile:5`},
		{"zero rate", zone("\t\t\tkey k\n\t\t\trate 0r/s"), `out of range [1, 1099511627776]; write 10r/s, 1r/2s or 30r/m, at Caddyfile:5`},
		{"negative rate", zone("\t\t\tkey k\n\t\t\trate -1r/s"), `-1 is out of range [1, 1099511627776]; write 10r/s, 1r/2s or 30r/m, at Caddyfile:5`},
		{"unparseable rate", zone("\t\t\tkey k\n\t\t\trate fast"), `rate "fast": want <N>r/<s|m|h|d>, such as 10r/s, 1r/2s or 30r/m, at Caddyfile:5`},
		{"bad unit", zone("\t\t\tkey k\n\t\t\trate 10r/w"), `unknown unit "w" (want s, m, h or d); write 10r/s, 1r/2s or 30r/m, at Caddyfile:5`},
		{"zero burst", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tburst 0"), `burst "0": want a whole number of at least 1, at Caddyfile:6`},
		{"negative burst", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tburst -3"), `burst "-3"`},
		{"unparseable burst", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tburst lots"), `burst "lots"`},
		{"unknown zone subdirective", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tlimit 5"), `zone "api": unrecognized subdirective "limit", at Caddyfile:6`},
		{"unknown subdirective", ":8080 {\n\trate_limit {\n\t\tzones x\n\t}\n}", `unrecognized subdirective "zones": did you mean zone?, at Caddyfile:3`},
		{"zone without name", ":8080 {\n\trate_limit {\n\t\tzone {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t}\n}", `zone needs a name`},
		{"no zones", ":8080 {\n\trate_limit {\n\t}\n}", `rate_limit needs at least one zone`},
		{"key without value", zone("\t\t\tkey\n\t\t\trate 1r/s"), `wrong argument count or unexpected line ending after 'key', at Caddyfile:4`},
		{"two keys", zone("\t\t\tkey a b\n\t\t\trate 1r/s"), `wrong argument count`},
		{"unknown matcher", zone("\t\t\tmatch {\n\t\t\t\tnope x\n\t\t\t}\n\t\t\tkey k\n\t\t\trate 1r/s"), `getting matcher module 'nope'`},
		{"directive argument", ":8080 {\n\trate_limit 5 {\n\t}\n}", `wrong argument count`},
		{"redis without addresses", withRedis("\t\t\ttimeout 1s"), `redis: addresses is required, at Caddyfile:5`},
		{"sync over half a window", zone("\t\t\tkey k\n\t\t\trate 10r/s\n\t\t\talgorithm fixed_window\n\t\t\tsync 600ms"), `zone "api": sync 600ms on a window of 1s: at most half the window (500ms), since each instance reads what the window has left once per sync, at Caddyfile:7`},
		{"sync on a leaky bucket", zone("\t\t\tkey k\n\t\t\trate 10r/s\n\t\t\talgorithm leaky_bucket\n\t\t\tsync 100ms"), `zone "api": sync applies to token_bucket, fixed_window, sliding_window_counter and quota zones: leaky_bucket counts exactly in Redis (leave sync out, or use one of them), at Caddyfile:7`},
		{"sync on a sliding log", zone("\t\t\tkey k\n\t\t\trate 10r/s\n\t\t\talgorithm sliding_window_log\n\t\t\tsync 100ms"), `zone "api": sync counts with counters, and sliding_window_log keeps one entry per request: use algorithm sliding_window_counter (close to it), or leave sync out, at Caddyfile:7`},
		{"sync on a concurrency zone", zone("\t\t\tkey k\n\t\t\tmax_concurrent 5\n\t\t\tsync 100ms"), `sync does not apply to max_concurrent: concurrency limits stay exact, at Caddyfile:6`},
		{"sync with ban", zone("\t\t\tkey k\n\t\t\trate 10r/s\n\t\t\tban 5 1m 10m\n\t\t\tsync 100ms"), `sync and ban: a ban is looked up in Redis on every request; leave one out, at Caddyfile:7`},
		{"sync too short", zone("\t\t\tkey k\n\t\t\trate 10r/s\n\t\t\tsync 1ms"), `zone "api": sync "1ms": want an interval from 10ms to 1h, such as 100ms, at Caddyfile:6`},
		{"sync with events", zone("\t\t\tkey k\n\t\t\tevents 10\n\t\t\twindow 1m\n\t\t\tsync 1s"), `sync counts with counters, and sliding_window_log keeps one entry per request: use algorithm sliding_window_counter`},
		{"redis unknown option", withRedis("\t\t\taddresses a:1\n\t\t\tnodes 3"), `redis: unrecognized subdirective "nodes", at Caddyfile:5`},
		{"redis bad timeout", withRedis("\t\t\taddresses a:1\n\t\t\ttimeout soon"), `redis: timeout "soon": want a positive duration such as 100ms, at Caddyfile:5`},
		{"redis zero timeout", withRedis("\t\t\taddresses a:1\n\t\t\ttimeout 0s"), `redis: timeout "0s"`},
		{"redis bad db", withRedis("\t\t\taddresses a:1\n\t\t\tdb -1"), `db "-1": want a whole number of at least 0, at Caddyfile:5`},
		{"redis bad pool", withRedis("\t\t\taddresses a:1\n\t\t\tpool_size 0"), `pool_size "0": want a whole number of at least 1`},
		{"redis prefix tag", withRedis("\t\t\taddresses a:1\n\t\t\tkey_prefix {x}"), `key_prefix "{x}" must not contain { or }`},
		{"redis tls option", withRedis("\t\t\taddresses a:1\n\t\t\ttls {\n\t\t\t\tcafile x\n\t\t\t}"), `redis tls: unrecognized subdirective "cafile", at Caddyfile:6`},
		{"redis twice", ":8080 {\n\trate_limit {\n\t\tredis {\n\t\t\taddresses a:1\n\t\t}\n\t\tredis {\n\t\t\taddresses a:1\n\t\t}\n\t}\n}", `redis is already configured, at Caddyfile:6`},
		{"on_store_error unknown", withStoreError("retry"), `on_store_error: want allow, deny [<status>] or local [instances <n>], got "retry", at Caddyfile:3`},
		{"on_store_error bad status", withStoreError("deny 200"), `on_store_error deny: status "200": want an error status, 400-599`},
		{"on_store_error bad instances", withStoreError("local instances 0"), `instances "0": want a whole number of at least 1`},
		{"on_store_error allow extra", withStoreError("allow 5"), `got "allow 5"`},
		{"on_store_error empty", withStoreError(""), `wrong argument count`},
		{"rate template without default", zone("\t\t\tkey k\n\t\t\trate {http.vars.plan}"), `zone "api": rate "{http.vars.plan}" has placeholders: give a default rate after it, at Caddyfile:5`},
		{"rate default bad", zone("\t\t\tkey k\n\t\t\trate {http.vars.plan} lots"), `zone "api": rate "lots": want <N>r/<s|m|h|d>`},
		{"rate literal with default", zone("\t\t\tkey k\n\t\t\trate 1r/s 2r/s"), `1r/s 2r/s: one value expected; a second one is only the default of a placeholder, as in rate {plan_rate} 100r/m, at Caddyfile:5`},
		{"cost zero", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tcost 0"), `zone "api": cost "0": want a whole number of at least 1, at Caddyfile:6`},
		{"cost default bad", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tcost {http.vars.cost} x"), `cost "x": want a whole number of at least 1`},
		{"burst three args", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tburst {a} 1 2"), `wrong argument count`},
		{"ipv4 prefix", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tipv4_prefix 33"), `zone "api": ipv4_prefix "33": want 0 (no grouping) to 32, at Caddyfile:6`},
		{"ipv6 prefix", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tipv6_prefix x"), `ipv6_prefix "x": want 0 (no grouping) to 128`},
		{"on_empty_key", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\ton_empty_key drop"), `zone "api": on_empty_key "drop": want shared or skip, at Caddyfile:6`},
		{"unknown algorithm", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\talgorithm gcra"), `zone "api": unknown algorithm "gcra" (want token_bucket, fixed_window, sliding_window_log, sliding_window_counter or leaky_bucket), at Caddyfile:6`},
		{"burst with a window", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\talgorithm fixed_window\n\t\t\tburst 5"), `zone "api": burst does not apply to fixed_window: its limit is N of the rate per window, at Caddyfile:7`},
		{"nodelay without leaky", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tnodelay"), `nodelay applies to leaky_bucket only`},
		{"concurrency with a rate", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tmax_concurrent 5"), `max_concurrent limits requests in flight: rate, events, window, algorithm, burst, cost, nodelay and ban do not apply`},
		{"concurrency zero", zone("\t\t\tkey k\n\t\t\tmax_concurrent 0"), `max_concurrent "0": want a whole number of at least 1, at Caddyfile:5`},
		{"lease short", zone("\t\t\tkey k\n\t\t\tmax_concurrent 2\n\t\t\tlease 10ms"), `zone "api": lease "10ms": want a duration of at least 1s, at Caddyfile:6`},
		{"lease with a rate", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tlease 10s"), `lease applies to max_concurrent only`},
		{"ban args", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tban 10 1m"), `zone "api": want ban <refusals> <within> <for>, e.g. ban 10 1m 15m, at Caddyfile:6`},
		{"ban numbers", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\tban 0 1m 15m"), `zone "api": ban 0 1m 15m: want a number of refusals and two positive durations`},
		{"response", ":8080 {\n\trate_limit {\n\t\tresponse html\n\t}\n}", `response "html": want json, problem or handle_errors, at Caddyfile:3`},
		{"headers", ":8080 {\n\trate_limit {\n\t\theaders draft\n\t}\n}", `headers "draft": want x_ratelimit, ietf, both or none, at Caddyfile:3`},
		{"jitter", ":8080 {\n\trate_limit {\n\t\tretry_after_jitter soon\n\t}\n}", `retry_after_jitter "soon": want a duration such as 5s`},
		{"dry_run arg", ":8080 {\n\trate_limit {\n\t\tdry_run yes\n\t}\n}", `wrong argument count`},
		{"local_cache", withRedis("\t\t\taddresses a:1\n\t\t\tlocal_cache -5"), `redis: local_cache "-5": want a number of clients, or off`},
		{"jwt without key", withJWT("\t\t\tissuer x"), `jwt: needs secret, public_key_file, jwks_file, jwks_url or issuer <url> discover, at Caddyfile:3`},
		{"jwt unknown option", withJWT("\t\t\tsecret s\n\t\t\talgorithms HS256"), `jwt: unrecognized subdirective "algorithms", at Caddyfile:5`},
		{"jwt bad from", withJWT("\t\t\tsecret s\n\t\t\tfrom query token"), `jwt: want from header <name> or from cookie <name>, at Caddyfile:5`},
		{"on_store_error block", ":8080 {\n\trate_limit {\n\t\ton_store_error allow {\n\t\t\tfoo\n\t\t}\n\t\tzone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t}\n}", `on_store_error takes no block, at Caddyfile:4`},
		{"empty response", ":8080 {\n\trate_limit {\n\t\tresponse \"\"\n\t}\n}", `response "": want json, problem or handle_errors, at Caddyfile:3`},
		{"empty on_empty_key", zone("\t\t\tkey k\n\t\t\trate 1r/s\n\t\t\ton_empty_key \"\""), `on_empty_key "": want shared or skip, at Caddyfile:6`},
		{"invalid duplicate zone", ":8080 {\n\trate_limit {\n\t\tzone a {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t\tzone a {\n\t\t\tkey k\n\t\t}\n\t}\n}", `duplicate zone "a", at Caddyfile:7`},
		{"jwt bad leeway", withJWT("\t\t\tsecret s\n\t\t\tleeway -1s"), `jwt: leeway "-1s": want a duration such as 30s`},
		{"jwks_url plain http", withJWT("\t\t\tjwks_url http://auth.example.com/jwks"), `jwt: "http://auth.example.com/jwks": want https:// (http:// only to a loopback host), at Caddyfile:3`},
		{"jwks_url relative", withJWT("\t\t\tjwks_url /jwks.json"), `jwt: "/jwks.json": want an absolute https:// URL, at Caddyfile:3`},
		{"jwks_url and discover", withJWT("\t\t\tjwks_url https://a.example/jwks\n\t\t\tissuer https://a.example discover"), `jwt: jwks_url or discover, not both, at Caddyfile:3`},
		{"issuer bad word", withJWT("\t\t\tissuer https://a.example discovery"), `jwt: want issuer <iss> or issuer <url> discover, at Caddyfile:4`},
		{"issuer no args", withJWT("\t\t\tsecret s\n\t\t\tissuer"), `jwt: want issuer <iss> or issuer <url> discover, at Caddyfile:5`},
		{"discover plain http", withJWT("\t\t\tissuer http://auth.example.com discover"), `want https://`},
		{"refresh_min bad", withJWT("\t\t\tjwks_url https://a.example/jwks\n\t\t\trefresh_min soon"), `jwt: refresh_min "soon": want a positive duration such as 5m, at Caddyfile:5`},
		{"fetch_timeout zero", withJWT("\t\t\tjwks_url https://a.example/jwks\n\t\t\tfetch_timeout 0s"), `jwt: fetch_timeout "0s": want a positive duration`},
		{"refresh bounds", withJWT("\t\t\tjwks_url https://a.example/jwks\n\t\t\trefresh_min 5m\n\t\t\trefresh_max 1m"), `jwt: refresh_max 1m0s is shorter than refresh_min 5m0s, at Caddyfile:3`},
		{"max_stale short", withJWT("\t\t\tjwks_url https://a.example/jwks\n\t\t\tmax_stale 10m"), `jwt: max_stale 10m0s is shorter than refresh_max 1h0m0s`},
		{"memory_capacity small", ":8080 {\n\trate_limit {\n\t\tmemory_capacity 10\n\t}\n}", `memory_capacity "10": want a whole number of at least 64, at Caddyfile:3`},
		{"memory_capacity word", ":8080 {\n\trate_limit {\n\t\tmemory_capacity lots\n\t}\n}", `memory_capacity "lots": want a whole number`},
		{"memory_capacity none", ":8080 {\n\trate_limit {\n\t\tmemory_capacity\n\t}\n}", `wrong argument count`},
		{"refresh without url", withJWT("\t\t\tsecret s\n\t\t\trefresh_max 2h"), `jwt: refresh_min, refresh_max, max_stale and fetch_timeout apply to jwks_url and discover only, at Caddyfile:3`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := adapt(t, c.src)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

func withRedis(block string) string {
	return ":8080 {\n\trate_limit {\n\t\tredis {\n" + block + "\n\t\t}\n\t\tzone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t}\n}"
}

func withJWT(block string) string {
	return ":8080 {\n\trate_limit {\n\t\tjwt {\n" + block + "\n\t\t}\n\t\tzone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t}\n}"
}

func TestCaddyfileClients(t *testing.T) {
	out, err := adapt(t, `:8080 {
	rate_limit {
		jwt {
			secret   {env.JWT_SECRET}
			from     cookie session
			issuer   https://auth.example
			audience api
			leeway   10s
		}
		zone per_user {
			key          {http.rate_limit.jwt.sub}
			rate         {http.vars.plan_rate} 100r/m
			burst        {http.vars.plan_burst} 20
			cost         5
			ipv4_prefix  24
			ipv6_prefix  56
			on_empty_key skip
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"jwt":{"audience":"api","from_cookie":"session","issuer":"https://auth.example","leeway":10000000000,"secret":"{env.JWT_SECRET}"}`,
		`"per_user":{"burst":"{http.vars.plan_burst}","cost":5,"default_burst":20,"default_rate":"100r/m","ipv4_prefix":24,"ipv6_prefix":56,"key":"{http.rate_limit.jwt.sub}","on_empty_key":"skip","rate":"{http.vars.plan_rate}"}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("adapted config lacks\n%s\nin\n%s", want, out)
		}
	}
}

func TestCaddyfileJWKS(t *testing.T) {
	out, err := adapt(t, withJWT("\t\t\tjwks_url https://auth.example.com/.well-known/jwks.json\n\t\t\trefresh_min 30s\n"+
		"\t\t\trefresh_max 2h\n\t\t\tmax_stale 12h\n\t\t\tfetch_timeout 5s\n\t\t\tsecret {env.JWT_SECRET}"))
	want := `"jwt":{"fetch_timeout":5000000000,"jwks_url":"https://auth.example.com/.well-known/jwks.json","max_stale":43200000000000,"refresh_max":7200000000000,"refresh_min":30000000000,"secret":"{env.JWT_SECRET}"}`
	if err != nil || !strings.Contains(out, want) {
		t.Fatalf("jwks_url: %v; adapted config lacks\n%s\nin\n%s", err, want, out)
	}
	out, err = adapt(t, withJWT("\t\t\tissuer https://tenant.eu.auth0.com/ discover\n\t\t\taudience api"))
	want = `"jwt":{"audience":"api","discover":true,"issuer":"https://tenant.eu.auth0.com/"}`
	if err != nil || !strings.Contains(out, want) {
		t.Fatalf("issuer discover: %v; adapted config lacks\n%s\nin\n%s", err, want, out)
	}
	out, err = adapt(t, withJWT("\t\t\tissuer https://auth.example\n\t\t\tjwks_url http://127.0.0.1:8081/jwks"))
	want = `"jwt":{"issuer":"https://auth.example","jwks_url":"http://127.0.0.1:8081/jwks"}`
	if err != nil || !strings.Contains(out, want) {
		t.Fatalf("issuer alone, loopback jwks_url: %v; adapted config lacks\n%s\nin\n%s", err, want, out)
	}
}

func withStoreError(args string) string {
	return ":8080 {\n\trate_limit {\n\t\ton_store_error " + args + "\n\t\tzone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t}\n}"
}

func TestCaddyfileRedis(t *testing.T) {
	out, err := adapt(t, `:8080 {
	rate_limit {
		redis {
			addresses   10.0.0.1:6379 10.0.0.2:6379
			addresses   10.0.0.3:6379
			username    limiter
			password    {env.REDIS_PASSWORD}
			key_prefix  gw:
			key_secret  {env.RL_KEY_SECRET}
			pool_size   20
			timeout     50ms
			tls {
				ca          /etc/redis/ca.pem
				server_name redis.internal
			}
		}
		on_store_error local instances 3
		zone z {
			key  {client_ip}
			rate 10r/s
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"on_store_error":{"instances":3,"mode":"local"}`,
		`"redis":{"addresses":["10.0.0.1:6379","10.0.0.2:6379","10.0.0.3:6379"],"key_prefix":"gw:","key_secret":"{env.RL_KEY_SECRET}","password":"{env.REDIS_PASSWORD}","pool_size":20,"timeout":50000000,"tls":{"ca":"/etc/redis/ca.pem","server_name":"redis.internal"},"username":"limiter"}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("adapted config lacks\n%s\nin\n%s", want, out)
		}
	}
	out, err = adapt(t, withStoreError("deny 429"))
	if err != nil || !strings.Contains(out, `"on_store_error":{"mode":"deny","status":429}`) {
		t.Fatalf("deny 429: %v\n%s", err, out)
	}
}

func TestCaddyfileProduction(t *testing.T) {
	out, err := adapt(t, `:8080 {
	rate_limit {
		redis {
			addresses   127.0.0.1:6379
			local_cache off
		}
		dry_run
		response           problem
		headers            both
		retry_after_jitter 5s
		log_keys
		zone api {
			key     {client_ip}
			rate    10r/s
			ban     10 1m 15m
			dry_run
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"dry_run":true,"handler":"rate_limit","headers":"both","log_keys":true`,
		`"response":"problem","retry_after_jitter":5000000000`,
		`"local_cache":-1`,
		`"ban":{"after":10,"for":900000000000,"within":60000000000}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("adapted config lacks\n%s\nin\n%s", want, out)
		}
	}
}

func TestCaddyfileExampleAdapts(t *testing.T) {
	src, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, err := adapt(t, string(src))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"handler":"rate_limit"`) {
		t.Fatalf("no rate_limit handler in\n%s", out)
	}
}

// TestCaddyfileMemoryCapacity: memory_capacity sets the memory store's
// capacity; handlers that share the store share the largest capacity one
// of them sets (the default when none does), and the capacity follows
// them as they are cleaned up. A JSON value under 64 is refused.
func TestCaddyfileMemoryCapacity(t *testing.T) {
	out, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tmemory_capacity 200000\n\t\tzone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t}\n}")
	if err != nil || !strings.Contains(out, `"memory_capacity":200000`) {
		t.Fatalf("adapted to %s (%v); want memory_capacity 200000", out, err)
	}
	handler := func(capacity int) *Handler {
		h := &Handler{MemoryCapacity: capacity, Zones: map[string]*Zone{"capacity_zone": {Key: "k", Rate: "1r/s"}}}
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	unset := handler(0)
	capacity := func() int { return unset.store.MemoryStats().Capacity }
	if got := capacity(); got != memstore.DefaultCapacity {
		t.Fatalf("capacity %d with none set; want the default, %d", got, memstore.DefaultCapacity)
	}
	small, large := handler(1000), handler(5000)
	if small.store != large.store || small.store != unset.store {
		t.Fatal("handlers with different capacities do not share the memory store")
	}
	if got := capacity(); got != 5000 {
		t.Fatalf("capacity %d with 1000 and 5000 set; want the largest, 5000", got)
	}
	large.Cleanup()
	if got := capacity(); got != 1000 {
		t.Fatalf("capacity %d once the handler of 5000 is gone; want 1000", got)
	}
	small.Cleanup()
	if got := capacity(); got != memstore.DefaultCapacity {
		t.Fatalf("capacity %d once no handler sets one; want the default", got)
	}
	if err := provision(t, &Handler{MemoryCapacity: 10, Zones: map[string]*Zone{"z": {Key: "k", Rate: "1r/s"}}}); err == nil ||
		!strings.Contains(err.Error(), "memory_capacity 10: want at least 64") {
		t.Fatalf("memory_capacity 10 in JSON: %v; want an error", err)
	}
}

// TestMemoryEvictionsReported: a full memory store's evictions are
// counted in caddy_rate_limit_memory_evictions_total and logged at
// warning level, once a minute at most, without the client keys.
func TestMemoryEvictionsReported(t *testing.T) {
	h := &Handler{MemoryCapacity: 64, Zones: map[string]*Zone{"evicting": {Key: "{http.request.header.X-Key}", Rate: "1r/m"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	old := h.store.logger
	h.store.logger = zap.New(core)
	h.store.evictionLogged.Store(0) // whatever an earlier test evicted in this shared store
	t.Cleanup(func() { h.store.logger = old })
	counted, evicted := testutil.ToFloat64(metrics.memoryEvictions), h.store.MemoryStats().Evictions
	for i := range 200 {
		r := clientRequest("GET", "/", "10.0.0.1")
		r.Header.Set("X-Key", fmt.Sprint("client-", i))
		if w := serve(h, r); w.Code != 200 {
			t.Fatalf("client %d: status %d", i, w.Code)
		}
	}
	if n := h.store.MemoryStats().Buckets; n > 64 {
		t.Fatalf("%d buckets kept; want at most the capacity, 64", n)
	}
	got, want := testutil.ToFloat64(metrics.memoryEvictions)-counted, float64(h.store.MemoryStats().Evictions-evicted)
	if want < 200-64 || got != want {
		t.Fatalf("memory_evictions_total grew by %v; the store evicted %v, want at least %d", got, want, 200-64)
	}
	if logs.Len() != 1 {
		t.Fatalf("%d warnings logged; want one a minute", logs.Len())
	}
	line := logs.All()[0]
	if !strings.Contains(line.Message, "memory store full") || strings.Contains(fmt.Sprint(line.Context), "client-") {
		t.Fatalf("logged %q %v; want the store full, without client keys", line.Message, line.Context)
	}
}
