package ratelimit

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestPlaceholderTypos: a placeholder Caddy cannot fill, which would give
// every client one bucket, fails adapt with its line and the name meant;
// other modules' names and a map's outputs pass.
func TestPlaceholderTypos(t *testing.T) {
	cases := map[string]string{
		"key {clientip}":                                                   `{clientip} is no placeholder Caddy knows (it would be empty for every request): did you mean {client_ip}?`,
		"key {http.request.heder.X-API-Key}":                               `did you mean {http.request.header.X-API-Key}?`,
		"key {http.request.remote_host}":                                   `did you mean {http.request.remote.host}?`,
		"key {http.request.nonsense}":                                      `{http.request.nonsense} is not a placeholder of Caddy's HTTP server`,
		"key k\n\t\t\trate {http.request.heder.X-Plan} 1r/s":               `rate "{http.request.heder.X-Plan}"`,
		"key k\n\t\t\trate 1r/s\n\t\t\tcost {http.request.heder.X-Cost} 1": `cost "{http.request.heder.X-Cost}"`,
	}
	for line, want := range cases {
		_, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\t"+line+"\n\t\t\trate 1r/s\n\t\t}\n\t}\n}\n")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "Caddyfile:") {
			t.Errorf("%s: %v; want %q with its line", line, err, want)
		}
	}
	for _, ok := range []string{"{client_ip}", "{http.request.header.X-API-Key}", "{http.vars.user}", "{plan}",
		"{cost}", "{paths}", "{tls.client}", "{my.var}", "{plan_rate}",
		"{http.auth.user.id}", "{http.rate_limit.jwt.sub}", "{http.request.remote.host}-{http.request.uri.query.id}"} {
		if _, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\tkey "+ok+"\n\t\t\trate 1r/s\n\t\t}\n\t}\n}\n"); err != nil {
			t.Errorf("key %s: %v; want it accepted", ok, err)
		}
	}
	err := provision(t, &Handler{Zones: map[string]*Zone{"z": {Key: "{client_ip}", Rate: "1r/s"}}})
	if err == nil || !strings.Contains(err.Error(), "in JSON write {http.vars.client_ip}") {
		t.Errorf("JSON key {client_ip}: %v; want the full name", err)
	}
}

// TestForgeableKeyWarned: a key on a header that any client sets to an
// address loads, with a warning that names {client_ip} and trusted_proxies.
func TestForgeableKeyWarned(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	h := &Handler{logger: zap.New(core), Zones: map[string]*Zone{"z": {Key: "{http.request.header.X-Forwarded-For}", Rate: "1r/s"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	if l := logs.All(); len(l) != 1 || !strings.Contains(l[0].Message, "{client_ip}") || !strings.Contains(l[0].Message, "trusted_proxies") {
		t.Fatalf("warnings %v; want one naming {client_ip} and trusted_proxies", l)
	}
}

// TestConstantKeyRefused: a key whose placeholders do not depend on the
// request fails adapt and load, naming key static and {client_ip}; with a
// request placeholder beside them it loads.
func TestConstantKeyRefused(t *testing.T) {
	for _, key := range []string{"{env.TENANT}", "{system.hostname}-{time.now.year}"} {
		_, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\tkey "+key+"\n\t\t\trate 1r/s\n\t\t}\n\t}\n}\n")
		if err == nil || !strings.Contains(err.Error(), "is the same for every request") || !strings.Contains(err.Error(), "key static") ||
			!strings.Contains(err.Error(), "Caddyfile:4") {
			t.Errorf("key %s: %v; want it refused at its line", key, err)
		}
		err = provision(t, &Handler{Zones: map[string]*Zone{"z": {Key: key, Rate: "1r/s"}}})
		if err == nil || !strings.Contains(err.Error(), "{client_ip}") {
			t.Errorf("JSON key %s: %v; want it refused", key, err)
		}
	}
	for _, key := range []string{"{env.TENANT}-{client_ip}", "static", "tenant-{http.request.header.X-Key}"} {
		if _, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\tkey "+key+"\n\t\t\trate 1r/s\n\t\t}\n\t}\n}\n"); err != nil {
			t.Errorf("key %s: %v; want it accepted", key, err)
		}
	}
	// With a Redis that instances share, {system.hostname} is a bucket per instance.
	withRedis := ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\tkey {system.hostname}\n\t\t\trate 1r/s\n\t\t}\n\t\tredis {\n\t\t\taddresses 127.0.0.1:6379\n\t\t}\n\t}\n}\n"
	if _, err := adapt(t, withRedis); err != nil {
		t.Errorf("key {system.hostname} with Redis: %v; want it accepted", err)
	}
}

// TestUnknownKeyPlaceholderWarned: a key placeholder that the replacer
// does not know for a request (here {http.auth.user.id}, with no
// authentication handler before) is logged once per zone, at warning
// level, without the request's values; known ones log nothing.
func TestUnknownKeyPlaceholderWarned(t *testing.T) {
	for _, key := range []string{"{http.auth.user.id}", "user-{http.auth.user.id}"} {
		core, logs := observer.New(zap.WarnLevel)
		h := &Handler{logger: zap.New(core), Zones: map[string]*Zone{"z": {Key: key, Rate: "10r/s"}}}
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			expectStatus(t, h, keyRequest("c"), http.StatusOK, "")
		}
		l := logs.FilterMessageSnippet("unknown for a request").All()
		if len(l) != 1 || l[0].ContextMap()["zone"] != "z" || !strings.Contains(l[0].ContextMap()["error"].(string), "http.auth.user.id") {
			t.Errorf("key %s: warnings %v; want one for zone z naming the placeholder", key, logs.All())
		}
	}
	core, logs := observer.New(zap.WarnLevel)
	h := &Handler{logger: zap.New(core), Zones: map[string]*Zone{"z": {Key: "{http.request.header.X-Key}-{http.vars.x}", Rate: "10r/s"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, h, keyRequest("c"), http.StatusOK, "")
	if logs.Len() != 0 {
		t.Errorf("known placeholders: warnings %v", logs.All())
	}
}

// TestUnbalancedBraces: a key, rate, burst or cost whose braces do not
// balance (which Caddy's replacer would leave as text, one bucket for
// every client) fails adapt at its line, naming the fix, and fails in
// JSON; escaped braces, as Caddy's replacer reads them, pass.
func TestUnbalancedBraces(t *testing.T) {
	cases := []struct{ line, want string }{
		{"key {http.request.header.X-Api-Key", `{http.request.header.X-Api-Key has no closing }`},
		{"key {http.request.header.X-Api-Key", `write {http.request.header.X-Api-Key}`},
		{"key {client_ip", `write {client_ip}`},
		{"key {header.X-API-Key}}", `a } that closes no placeholder`},
		{"key {header.X-API-Key}}", `write {http.request.header.X-API-Key}`},
		{"key header.X-API-Key}", `write {header.X-API-Key}`},
		{"key {client_ip}-{header.X", `write {http.vars.client_ip}-{header.X}`},
		{"key {a{http.vars.b}", `{a has no closing }`},
		{"key x-{}", `{} names no placeholder`},
		{"key k\n\t\t\trate {http.vars.plan 10r/s", `rate "{http.vars.plan"`},
		{"key k\n\t\t\trate http.vars.plan} 10r/s", `rate "http.vars.plan}": a } that closes no placeholder`},
		{"key k\n\t\t\trate 1r/s\n\t\t\tburst {http.vars.burst", `burst "{http.vars.burst"`},
		{"key k\n\t\t\trate 1r/s\n\t\t\tcost 5}", `cost "5}": a } that closes no placeholder, which Caddy keeps as text; write 5,`},
	}
	for _, c := range cases {
		_, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\t"+c.line+"\n\t\t\trate 1r/s\n\t\t}\n\t}\n}\n")
		line := "Caddyfile:" + fmt.Sprint(4+strings.Count(c.line, "\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), line) {
			t.Errorf("%s: %v; want %q, at %s", c.line, err, c.want, line)
		}
	}
	for _, ok := range []string{`\{literal\}-{client_ip}`, `{client_ip}-\}`, `{http.request.header.X\}Y}`} {
		if _, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tzone z {\n\t\t\tkey "+ok+"\n\t\t\trate 1r/s\n\t\t}\n\t}\n}\n"); err != nil {
			t.Errorf("key %s: %v; want it accepted", ok, err)
		}
	}
	for field, z := range map[string]*Zone{
		`key "{http.request.header.X-Api-Key"`: {Key: "{http.request.header.X-Api-Key", Rate: "1r/s"},
		`rate "{http.vars.plan"`:               {Key: "k", Rate: "{http.vars.plan", DefaultRate: "1r/s"},
		`burst "5}"`:                           {Key: "k", Rate: "1r/s", Burst: "5}"},
		`cost "{http.vars.cost"`:               {Key: "k", Rate: "1r/s", Cost: "{http.vars.cost"},
	} {
		err := provision(t, &Handler{Zones: map[string]*Zone{"z": z}})
		if err == nil || !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), "write ") {
			t.Errorf("JSON %s: %v; want it refused with the fix", field, err)
		}
	}
	if err := provision(t, &Handler{Zones: map[string]*Zone{"z": {Key: `\{x\}-{http.vars.client_ip}`, Rate: "1r/s"}}}); err != nil {
		t.Errorf("JSON key with escaped braces: %v", err)
	}
	// The fix of a stray } may be a shorthand, which JSON spells in full.
	err := provision(t, &Handler{Zones: map[string]*Zone{"z": {Key: "{header.X-API-Key}", Rate: "1r/s"}}})
	if err == nil || !strings.Contains(err.Error(), "in JSON write {http.request.header.X-API-Key}") {
		t.Errorf("JSON key {header.X-API-Key}: %v; want the full name", err)
	}
}

// TestClientIPWithoutStrictWarned: a zone keyed by {client_ip} in a
// server that trusts proxies without trusted_proxies_strict (whose
// {client_ip} is then the leftmost X-Forwarded-For address, which a
// client behind an appending proxy sets) loads with a warning that says
// so and names trusted_proxies_strict; with it, without trusted proxies,
// or with another key, nothing is logged.
func TestClientIPWithoutStrictWarned(t *testing.T) {
	cases := []struct {
		name, servers, key string
		warned             bool
	}{
		{"trusted, not strict", "trusted_proxies static 10.0.0.0/8", "{client_ip}", true},
		{"in a combined key", "trusted_proxies static 10.0.0.0/8", "{client_ip}-{path}", true},
		{"by its full name", "trusted_proxies static 10.0.0.0/8", "{http.vars.client_ip}", true},
		{"strict", "trusted_proxies static 10.0.0.0/8\n\t\ttrusted_proxies_strict", "{client_ip}", false},
		{"no trusted proxies", "", "{client_ip}", false},
		{"another key", "trusted_proxies static 10.0.0.0/8", "{http.request.header.X-API-Key}", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			logFile := t.TempDir() + "/rate_limit.log"
			servers := ""
			if c.servers != "" {
				servers = "\tservers {\n\t\t" + c.servers + "\n\t}\n"
			}
			src := "{\n\tlog rl {\n\t\toutput file " + logFile + "\n\t\tinclude http.handlers.rate_limit\n\t}\n" + servers +
				"}\n\nhttp://127.0.0.1:8080 {\n\trate_limit {\n\t\tzone per_ip {\n\t\t\tkey " + c.key +
				"\n\t\t\trate 100r/m\n\t\t}\n\t}\n\trespond ok\n}\n"
			if err := loadConfig(t, "caddyfile", src); err != nil {
				t.Fatal(err)
			}
			logs, _ := os.ReadFile(logFile)
			warned := strings.Contains(string(logs), "trusted_proxies_strict")
			if warned != c.warned || warned && (!strings.Contains(string(logs), `"zone":"per_ip"`) ||
				!strings.Contains(string(logs), "X-Forwarded-For")) {
				t.Fatalf("logs:\n%s\nwant a warning naming the zone, X-Forwarded-For and trusted_proxies_strict: %v", logs, c.warned)
			}
		})
	}
}
