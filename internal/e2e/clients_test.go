package e2e

import (
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// from sends GET / as if relayed for client (X-Forwarded-For) and returns
// the status.
func from(t *testing.T, c *testcaddy.Caddy, path, client string) int {
	t.Helper()
	resp, _ := get(t, c, path, "X-Forwarded-For", client)
	return resp.StatusCode
}

const perClientIP = `
	rate_limit {
		zone per_ip {
			key   {client_ip}
			rate  1r/h
			burst 1
		}
		zone subnet {
			match {
				path /subnet
			}
			key         {client_ip}
			rate        1r/h
			burst       1
			ipv4_prefix 24
			ipv6_prefix 64
		}
	}
	respond "{client_ip}"
`

func TestForgedForwardedForFromAnUntrustedPeer(t *testing.T) {
	c := testcaddy.Start(t, perClientIP)
	if s := from(t, c, "/", "198.51.100.1"); s != 200 {
		t.Fatalf("first request: %d", s)
	}
	// Another forged address must not give the peer (127.0.0.1) a new bucket.
	for _, forged := range []string{"198.51.100.2", "203.0.113.9, 198.51.100.3", "not-an-ip"} {
		if s := from(t, c, "/", forged); s != 429 {
			t.Fatalf("X-Forwarded-For %q from an untrusted peer: status %d; want 429", forged, s)
		}
	}
}

func TestForwardedForFromATrustedProxy(t *testing.T) {
	c := testcaddy.Start(t, perClientIP, "\tservers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}")
	want := []struct {
		path, client string
		status       int
	}{
		{"/", "198.51.100.1", 200},
		{"/", "198.51.100.2", 200}, // another client behind the proxy
		{"/", "198.51.100.1", 429},
		{"/subnet", "10.1.2.3", 200},
		{"/subnet", "10.1.2.99", 429}, // same /24
		{"/subnet", "10.1.3.1", 200},  // another /24
		{"/subnet", "2001:db8:0:1::1", 200},
		{"/subnet", "2001:db8:0:1:ffff::2", 429}, // same /64: rotating does not help
		{"/subnet", "2001:db8:0:2::1", 200},
	}
	for _, w := range want {
		if s := from(t, c, w.path, w.client); s != w.status {
			t.Fatalf("%s for %s: status %d; want %d", w.path, w.client, s, w.status)
		}
	}
}

const jwtSecret = "e2e-secret-of-at-least-32-bytes!"

func token(t *testing.T, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func user(sub, plan string) jwt.MapClaims {
	return jwt.MapClaims{"sub": sub, "plan": plan, "iss": "https://auth.test", "exp": time.Now().Add(time.Hour).Unix()}
}

func TestJWTClaimsTiersAndCosts(t *testing.T) {
	t.Setenv("JWT_SECRET", jwtSecret)
	c := testcaddy.Start(t, `
	map {http.rate_limit.jwt.plan} {plan_rate} {
		pro     5r/h
		default free-plan
	}
	rate_limit {
		jwt {
			secret {env.JWT_SECRET}
			issuer https://auth.test
		}
		zone per_user {
			match {
				path /user
			}
			key          {http.rate_limit.jwt.sub}
			rate         {plan_rate} 2r/h
			on_empty_key skip
		}
		zone search {
			match {
				path /search
			}
			key   {http.rate_limit.jwt.sub}
			rate  1r/h
			burst 10
			cost  5
		}
	}
	respond "user={http.rate_limit.jwt.sub}"
`)
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	call := func(path string, headers []string) (int, string) {
		t.Helper()
		resp, body := get(t, c, path, headers...)
		return resp.StatusCode, body
	}
	alice := bearer(token(t, jwt.SigningMethodHS256, []byte(jwtSecret), user("alice", "pro")))
	bob := bearer(token(t, jwt.SigningMethodHS256, []byte(jwtSecret), user("bob", "free")))

	// The pro plan (map) gives alice 5r/h, burst 5; bob's plan is no rate:
	// the zone's default, 2r/h.
	for i := range 6 {
		if s, body := call("/user", alice); (s == 200) != (i < 5) || s == 200 && body != "user=alice" {
			t.Fatalf("alice, request %d: %d %q", i, s, body)
		}
	}
	for i := range 3 {
		if s, _ := call("/user", bob); (s == 200) != (i < 2) {
			t.Fatalf("bob, request %d: %d", i, s)
		}
	}
	// Tokens that fail verification give no claims: no key, and this zone
	// skips requests without one (the body shows no claim either).
	bad := map[string]string{
		"forged signature": token(t, jwt.SigningMethodHS256, []byte("another secret, 32 bytes long!!!"), user("alice", "pro")),
		"alg none":         token(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, user("alice", "pro")),
		"expired":          token(t, jwt.SigningMethodHS256, []byte(jwtSecret), jwt.MapClaims{"sub": "alice", "iss": "https://auth.test", "exp": time.Now().Add(-time.Hour).Unix()}),
		"wrong issuer":     token(t, jwt.SigningMethodHS256, []byte(jwtSecret), jwt.MapClaims{"sub": "alice", "iss": "https://evil.test"}),
		"garbage":          "garbage",
		"20 KB":            strings.Repeat("x", 20<<10), // over the 16 KB read
	}
	for name, tok := range bad {
		if s, body := call("/user", bearer(tok)); s != 200 || body != "user=" {
			t.Fatalf("%s token: %d %q; want 200 with no claims", name, s, body)
		}
	}
	// A search costs 5 of a burst of 10.
	for i := range 3 {
		if s, _ := call("/search", bob); (s == 200) != (i < 2) {
			t.Fatalf("search, request %d: %d", i, s)
		}
	}
	// Without a valid token, all searches share one bucket (shared).
	for i, tok := range []string{"", bad["forged signature"], bad["alg none"]} {
		if s, _ := call("/search", bearer(tok)); (s == 200) != (i < 2) {
			t.Fatalf("anonymous search %d: %d", i, s)
		}
	}
	if n := strings.Count(c.WaitLogs("placeholder gave no valid value"), "placeholder gave no valid value"); n != 1 {
		t.Fatalf("the bad plan rate was warned about %d times; want once", n)
	}
}

// TestTwoHandlersTrustDifferently: each rate_limit handler reads claims
// with its own checks, even on one request.
func TestTwoHandlersTrustDifferently(t *testing.T) {
	t.Setenv("JWT_SECRET", jwtSecret)
	c := testcaddy.Start(t, `
	route {
		rate_limit {
			jwt {
				secret {env.JWT_SECRET}
			}
			zone everyone {
				key  {http.rate_limit.jwt.sub}
				rate 100r/h
			}
		}
		rate_limit /admin {
			jwt {
				secret   {env.JWT_SECRET}
				audience admin
			}
			zone admin {
				key          {http.rate_limit.jwt.sub}
				rate         1r/h
				burst        1
				on_empty_key skip
			}
		}
		respond "sub={http.rate_limit.jwt.sub}"
	}
`)
	claims := func(aud string) jwt.MapClaims {
		return jwt.MapClaims{"sub": "carol", "aud": aud, "exp": time.Now().Add(time.Hour).Unix()}
	}
	api := []string{"Authorization", "Bearer " + token(t, jwt.SigningMethodHS256, []byte(jwtSecret), claims("api"))}
	admin := []string{"Authorization", "Bearer " + token(t, jwt.SigningMethodHS256, []byte(jwtSecret), claims("admin"))}
	if resp, body := get(t, c, "/", api...); resp.StatusCode != 200 || body != "sub=carol" {
		t.Fatalf("/ with an api token: %d %q", resp.StatusCode, body)
	}
	// The admin handler does not accept an api token: no claims there.
	for range 3 {
		if resp, body := get(t, c, "/admin", api...); resp.StatusCode != 200 || body != "sub=" {
			t.Fatalf("/admin with an api token: %d %q; want 200 with no claims", resp.StatusCode, body)
		}
	}
	if resp, body := get(t, c, "/admin", admin...); resp.StatusCode != 200 || body != "sub=carol" {
		t.Fatalf("/admin with an admin token: %d %q", resp.StatusCode, body)
	}
	if resp, _ := get(t, c, "/admin", admin...); resp.StatusCode != 429 {
		t.Fatalf("/admin, second admin request: %d; want 429", resp.StatusCode)
	}
}

// TestKeyFromAnAuthModule: after basic_auth, {http.auth.user.id} names the
// client. (Both users' password is hunter2, hashed with bcrypt cost 4.)
func TestKeyFromAnAuthModule(t *testing.T) {
	c := testcaddy.Start(t, `
	basic_auth {
		alice $2a$04$k/0r19ajEeaLpdZlifpKou1kbHPYZH4VxQeB3ZY0wgm/fi3Kcd3ry
		bob   $2a$04$k/0r19ajEeaLpdZlifpKou1kbHPYZH4VxQeB3ZY0wgm/fi3Kcd3ry
	}
	rate_limit {
		zone per_user {
			key   {http.auth.user.id}
			rate  1r/h
			burst 2
		}
	}
	respond "ok"
`, "\torder rate_limit after basic_auth")
	auth := func(user string) []string {
		return []string{"Authorization", "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":hunter2"))}
	}
	for i, want := range []int{200, 200, 429} {
		if resp, _ := get(t, c, "/", auth("alice")...); resp.StatusCode != want {
			t.Fatalf("alice, request %d: %d; want %d", i, resp.StatusCode, want)
		}
	}
	if resp, _ := get(t, c, "/", auth("bob")...); resp.StatusCode != 200 {
		t.Fatalf("bob: %d; want 200 (a bucket of his own)", resp.StatusCode)
	}
}

// recipeServers is the servers block of the per-IP recipe
// (docs/recipes.md#limit-each-client-by-ip-address), as global options,
// with this test's loopback address as the load balancer.
func recipeServers(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/recipes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, recipe, _ := strings.Cut(string(doc), "## Limit each client by IP address\n")
	_, block, _ := strings.Cut(recipe, "```caddyfile\n{\n")
	servers, _, ok := strings.Cut(block, "\n}\n")
	if !ok || !strings.Contains(servers, "trusted_proxies static 10.0.0.0/8") {
		t.Fatalf("no servers block with trusted_proxies static 10.0.0.0/8 in the recipe:\n%s", servers)
	}
	return strings.Replace(servers, "10.0.0.0/8", "127.0.0.1/32", 1)
}

// TestRecipeBehindAnAppendingProxy: behind a load balancer that appends
// the address it saw to the client's X-Forwarded-For, the per-IP recipe's
// servers block keeps a refused client refused whatever address it
// writes in front; without trusted_proxies_strict, such a client gets a
// fresh bucket per request, and the config loads with a warning that
// names trusted_proxies_strict.
func TestRecipeBehindAnAppendingProxy(t *testing.T) {
	servers := recipeServers(t)
	c := testcaddy.Start(t, perClientIP, servers)
	if resp, body := get(t, c, "/", "X-Forwarded-For", "203.0.113.7"); resp.StatusCode != 200 || body != "203.0.113.7" {
		t.Fatalf("the client's first request: %d %q; want 200 for 203.0.113.7", resp.StatusCode, body)
	}
	for i := range 5 {
		forged := fmt.Sprintf("9.9.9.%d, 203.0.113.7", i)
		if s := from(t, c, "/", forged); s != 429 {
			t.Fatalf("X-Forwarded-For %q with the recipe: status %d; want 429", forged, s)
		}
	}
	if s := from(t, c, "/", "198.51.100.1"); s != 200 {
		t.Fatalf("another client: status %d; want 200", s)
	}

	loose := testcaddy.Start(t, perClientIP, strings.Replace(servers, "trusted_proxies_strict", "", 1))
	if logs := loose.WaitLogs("trusted_proxies_strict"); !strings.Contains(logs, "trusted_proxies_strict") {
		t.Fatalf("without trusted_proxies_strict: no warning naming it in\n%s", logs)
	}
	for i := range 3 {
		forged := fmt.Sprintf("9.9.9.%d, 203.0.113.7", i)
		if s := from(t, loose, "/", forged); s != 200 {
			t.Fatalf("X-Forwarded-For %q without trusted_proxies_strict: status %d; want 200 (a fresh bucket)", forged, s)
		}
	}
}
