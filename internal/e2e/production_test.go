package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// scrape returns the value of a metric line (name with labels) from
// Caddy's admin /metrics, or -1.
func scrape(t *testing.T, c *testcaddy.Caddy, series string) float64 {
	t.Helper()
	resp, err := http.Get(c.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

func TestMetricsAndDryRun(t *testing.T) {
	c := testcaddy.Start(t, `
	rate_limit {
		zone api {
			key   {client_ip}
			rate  1r/h
			burst 2
		}
		zone rollout {
			key     {client_ip}
			rate    1r/h
			burst   1
			dry_run
		}
	}
	respond "ok"
`)
	for i, want := range []int{200, 200, 429, 429} {
		resp, _ := get(t, c, "/")
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d; want %d (the dry-run zone must never refuse)", i, resp.StatusCode, want)
		}
		if resp.Header.Get("X-RateLimit-Limit") != "2" {
			t.Fatalf("request %d: headers of the dry-run zone: %v", i, resp.Header)
		}
	}
	want := map[string]float64{
		`caddy_rate_limit_decisions_total{result="allowed",zone="api"}`:     2,
		`caddy_rate_limit_decisions_total{result="denied",zone="api"}`:      2,
		`caddy_rate_limit_decisions_total{result="allowed",zone="rollout"}`: 1,
		`caddy_rate_limit_decisions_total{result="dry_run",zone="rollout"}`: 3,
		`caddy_rate_limit_store_duration_seconds_count{store="memory"}`:     8,
	}
	for series, n := range want {
		if got := scrape(t, c, series); got != n {
			t.Errorf("%s = %v; want %v", series, got, n)
		}
	}
	if !strings.Contains(c.WaitLogs("dry run: would be rate limited"), "dry run: would be rate limited") {
		t.Error("dry-run refusals are not logged")
	}
	// A reload registers the metrics again; counts go on.
	if err := c.Reload(`
	rate_limit {
		zone api {
			key   {client_ip}
			rate  1r/h
			burst 2
		}
	}
	respond "ok"
`); err != nil {
		t.Fatal(err)
	}
	get(t, c, "/")
	if got := scrape(t, c, `caddy_rate_limit_decisions_total{result="denied",zone="api"}`); got != 3 {
		t.Errorf("after a reload: denied = %v; want 3", got)
	}
}

func TestHandlerDryRunNeverBlocks(t *testing.T) {
	c := testcaddy.Start(t, `
	rate_limit {
		dry_run
		zone api {
			key  {client_ip}
			rate 1r/h
		}
	}
	respond "ok"
`)
	for i := range 5 {
		if resp, _ := get(t, c, "/"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("request %d: %d %v", i, resp.StatusCode, resp.Header)
		}
	}
}

func TestDryRunHeaders(t *testing.T) {
	c := testcaddy.Start(t, `
	rate_limit {
		dry_run_headers
		zone api {
			key   {client_ip}
			rate  100r/h
		}
		zone coming {
			key     {client_ip}
			rate    1r/h
			burst   2
			dry_run
		}
	}
	respond "ok"
`)
	for i, want := range []string{"1", "0", "0", "0"} {
		resp, _ := get(t, c, "/")
		if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != want ||
			resp.Header.Get("X-RateLimit-Limit") != "2" || resp.Header.Get("Retry-After") != "" {
			t.Fatalf("request %d: %d %v; want 200 with the dry-run zone's headers, remaining %s", i, resp.StatusCode, resp.Header, want)
		}
	}
}

func TestProblemJSONAndIETFHeaders(t *testing.T) {
	c := testcaddy.Start(t, `
	rate_limit {
		response problem
		headers  ietf
		zone api {
			key   {client_ip}
			rate  1r/m
		}
	}
	respond "ok"
`)
	resp, _ := get(t, c, "/")
	if p, r := resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"); p != `"api";q=1;w=60` || !regexp.MustCompile(`^"api";r=0;t=(59|60)$`).MatchString(r) {
		t.Fatalf("RateLimit-Policy %q, RateLimit %q", p, r)
	}
	if resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Fatal("X-RateLimit-* sent with headers ietf")
	}
	// response problem: RFC 9457's about:blank; the draft's quota-exceeded
	// type to a client that accepts application/problem+json.
	for _, accept := range []string{"", "application/problem+json"} {
		resp, body := get(t, c, "/", "Accept", accept)
		var p struct {
			Type, Title, Detail, Zone string
			Status                    int
			RetryAfter                int      `json:"retry_after"`
			Violated                  []string `json:"violated-policies"`
		}
		json.Unmarshal([]byte(body), &p)
		typ, title, violated := "about:blank", "Too Many Requests", 0
		if accept != "" {
			typ, title, violated = "https://iana.org/assignments/http-problem-types#quota-exceeded", "Quota Exceeded", 1
		}
		if resp.StatusCode != 429 || resp.Header.Get("Content-Type") != "application/problem+json" || resp.Header.Get("Vary") != "Accept" ||
			p.Type != typ || p.Title != title || len(p.Violated) != violated || violated == 1 && p.Violated[0] != "api" ||
			p.Zone != "api" || p.RetryAfter < 59 || p.RetryAfter > 60 || !strings.Contains(p.Detail, "1 request per minute") ||
			resp.Header.Get("Retry-After") != strconv.Itoa(p.RetryAfter) {
			t.Fatalf("Accept %q: %d %v %s", accept, resp.StatusCode, resp.Header, body)
		}
	}
}

func TestHandleErrorsAndJitter(t *testing.T) {
	c := testcaddy.Start(t, `
	rate_limit {
		response           handle_errors
		headers            none
		retry_after_jitter 10s
		zone api {
			key   {client_ip}
			rate  1r/m
			burst 1
		}
	}
	respond "ok"
	handle_errors 429 {
		respond "slow down: {http.rate_limit.zone} {http.rate_limit.retry_after} {err.status_code}"
	}
`)
	if resp, _ := get(t, c, "/"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Fatalf("first request: %d %v (headers none)", resp.StatusCode, resp.Header)
	}
	seen := map[string]bool{}
	for range 20 {
		resp, body := get(t, c, "/")
		retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != 429 || retry < 60 || retry > 70 || body != "slow down: api "+strconv.Itoa(retry)+" 429" {
			t.Fatalf("%d Retry-After %d body %q; want 429 from handle_errors, 60 to 70 s", resp.StatusCode, retry, body)
		}
		seen[resp.Header.Get("Retry-After")] = true
	}
	if len(seen) < 2 {
		t.Fatalf("20 refusals, one Retry-After: %v: no jitter", seen)
	}
}

func TestLogKeysOptIn(t *testing.T) {
	site := func(opt string) string {
		return `
	rate_limit {
		` + opt + `
		zone api {
			key   {http.request.header.X-API-Key}
			rate  1r/h
			burst 1
		}
	}
	respond "ok"
`
	}
	for _, c := range []struct {
		opt  string
		want bool
	}{{"", false}, {"log_keys", true}} {
		caddy := testcaddy.Start(t, site(c.opt))
		get(t, caddy, "/", "X-API-Key", "secret-key-123")
		get(t, caddy, "/", "X-API-Key", "secret-key-123")
		logs := caddy.WaitLogs("rate limited")
		if !strings.Contains(logs, "rate limited") {
			t.Fatalf("no debug log of the refusal:\n%s", logs)
		}
		if strings.Contains(logs, "secret-key-123") != c.want {
			t.Fatalf("%q: key in the logs = %v; want %v", c.opt, !c.want, c.want)
		}
	}
}

// admin sends method to Caddy's admin API and decodes the JSON answer.
func admin(t *testing.T, c *testcaddy.Caddy, method, path string) (int, map[string]any, string) {
	t.Helper()
	return adminBody(t, c, method, path, "")
}

// adminBody is admin with a request body.
func adminBody(t *testing.T, c *testcaddy.Caddy, method, path, reqBody string) (int, map[string]any, string) {
	t.Helper()
	req, _ := http.NewRequest(method, c.Admin+path, strings.NewReader(reqBody))
	if reqBody != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(body, &m)
	return resp.StatusCode, m, string(body)
}

func TestAdminAPI(t *testing.T) {
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			c := testcaddy.Start(t, "\trate_limit {\n"+store+`
		zone api {
			key   {http.request.header.X-API-Key}
			rate  1r/h
			burst 5
		}
		zone search {
			key       {http.request.header.X-API-Key}
			algorithm sliding_window_log
			rate      10r/m
		}
	}
	respond "ok"
`)
			status, _, body := admin(t, c, "GET", "/rate_limit/zones")
			if status != 200 || !strings.Contains(body, `"name":"api"`) || !strings.Contains(body, `"algorithm":"sliding_window_log"`) ||
				!strings.Contains(body, `"store":"`+name+`"`) {
				t.Fatalf("GET zones: %d %s", status, body)
			}
			key := "team/a b" // escaped in the path
			for range 2 {
				get(t, c, "/", "X-API-Key", key)
			}
			path := "/rate_limit/zones/api/keys/" + url.PathEscape(key)
			status, u, body := admin(t, c, "GET", path)
			if status != 200 || u["limit"] != 5.0 || u["remaining"] != 3.0 || u["key"] != key || u["reset"].(float64) < float64(time.Now().Unix()) {
				t.Fatalf("GET %s: %d %s", path, status, body)
			}
			if status, _, body := admin(t, c, "DELETE", path); status != 200 {
				t.Fatalf("DELETE %s: %d %s", path, status, body)
			}
			if resp, _ := get(t, c, "/", "X-API-Key", key); resp.Header.Get("X-RateLimit-Remaining") != "4" {
				t.Fatalf("after the reset: remaining %q; want 4 (one zone reset, the other not)", resp.Header.Get("X-RateLimit-Remaining"))
			}
			if status, _, _ := admin(t, c, "GET", "/rate_limit/zones/nope/keys/x"); status != 404 {
				t.Fatalf("unknown zone: %d", status)
			}
			if status, _, _ := admin(t, c, "POST", path); status != 405 {
				t.Fatalf("POST: %d", status)
			}
			adminKeyInBody(t, c)
		})
	}
}

// adminKeyInBody: the POST forms of the lookup and the reset take the key
// in their body, which keeps it out of Caddy's admin.api log of URIs.
func adminKeyInBody(t *testing.T, c *testcaddy.Caddy) {
	t.Helper()
	const secret = "sk-live-only-in-bodies"
	for range 2 {
		get(t, c, "/", "X-API-Key", secret)
	}
	status, u, body := adminBody(t, c, "POST", "/rate_limit/zones/api/lookup", `{"key":"`+secret+`"}`)
	if status != 200 || u["remaining"] != 3.0 || u["key"] != secret {
		t.Fatalf("POST lookup: %d %s", status, body)
	}
	if status, _, body := adminBody(t, c, "POST", "/rate_limit/zones/api/reset", `{"key":"`+secret+`"}`); status != 200 {
		t.Fatalf("POST reset: %d %s", status, body)
	}
	if resp, _ := get(t, c, "/", "X-API-Key", secret); resp.Header.Get("X-RateLimit-Remaining") != "4" {
		t.Fatalf("after the POST reset: remaining %q; want 4", resp.Header.Get("X-RateLimit-Remaining"))
	}
	for _, bad := range []string{"", "{", `{"key":1}`, `{"keys":"x"}`} {
		if status, _, _ := adminBody(t, c, "POST", "/rate_limit/zones/api/lookup", bad); status != 400 {
			t.Fatalf("POST lookup with body %q: %d; want 400", bad, status)
		}
	}
	if status, _, _ := admin(t, c, "GET", "/rate_limit/zones/api/lookup"); status != 405 {
		t.Fatalf("GET lookup: %d; want 405", status)
	}
	if logs := c.Logs(); strings.Contains(logs, secret) {
		t.Fatalf("the key is in Caddy's logs: %s", logs)
	}
}

// evalshaCalls is how many EVALSHA commands a Redis server has run.
func evalshaCalls(t *testing.T, addr string) int {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`cmdstat_evalsha:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestHotKeyRefusedLocally: a client hammering past its limit is refused
// from the local cache, without Redis calls, until it could pass.
func TestHotKeyRefusedLocally(t *testing.T) {
	srv := redistest.NewServer(t)
	c := testcaddy.Start(t, `
	rate_limit {
		redis {
			addresses `+srv.Addr+`
			timeout   10s
		}
		zone api {
			key   {http.request.header.X-API-Key}
			rate  1r/m
			burst 2
		}
	}
	respond "ok"
`)
	for i, want := range []int{200, 200, 429} {
		if s := status(t, c.URL, "/", "hot"); s != want {
			t.Fatalf("request %d: %d; want %d", i, s, want)
		}
	}
	before := evalshaCalls(t, srv.Addr)
	for range 50 {
		resp, _ := get(t, c, "/", "X-API-Key", "hot")
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("hot key: %d %v", resp.StatusCode, resp.Header)
		}
	}
	if after := evalshaCalls(t, srv.Addr); after != before {
		t.Fatalf("50 refusals of a hot key made %d Redis calls; want none", after-before)
	}
	if got := scrape(t, c, `caddy_rate_limit_local_cache_hits_total{zone="api"}`); got != 50 {
		t.Fatalf("local_cache_hits_total = %v; want 50", got)
	}
	// Another key still goes to Redis.
	if s := status(t, c.URL, "/", "cold"); s != 200 || evalshaCalls(t, srv.Addr) != before+1 {
		t.Fatalf("another key: %d, %d Redis calls", s, evalshaCalls(t, srv.Addr)-before)
	}
	// An admin reset clears this instance's cache too.
	if status, _, body := admin(t, c, "DELETE", "/rate_limit/zones/api/keys/hot"); status != 200 {
		t.Fatalf("reset: %d %s", status, body)
	}
	if s := status(t, c.URL, "/", "hot"); s != 200 {
		t.Fatalf("after a reset: %d; want 200", s)
	}
}

// TestBanSurvivesAcrossInstances: refusals counted on two instances ban a
// client on both, for longer than its bucket would refuse it.
func TestBanSurvivesAcrossInstances(t *testing.T) {
	srv := redistest.NewServer(t)
	site := `
	rate_limit {
		redis {
			addresses ` + srv.Addr + `
			timeout   10s
		}
		zone api {
			key   {http.request.header.X-API-Key}
			rate  1r/s
			burst 1
			ban   3 1m 1h
		}
	}
	respond "ok"
`
	a, b := testcaddy.Start(t, site), testcaddy.Start(t, site)
	retry := func(c *testcaddy.Caddy) (int, int) {
		resp, _ := get(t, c, "/", "X-API-Key", "offender")
		n, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return resp.StatusCode, n
	}
	for i, c := range []*testcaddy.Caddy{a, a, b, a} {
		s, n := retry(c)
		switch {
		case i == 0 && s != 200:
			t.Fatalf("first request: %d", s)
		case i > 0 && s != 429:
			t.Fatalf("request %d: %d", i, s)
		case i == 3 && n < 3500:
			t.Fatalf("the third refusal: Retry-After %d; want the ban's hour", n)
		}
	}
	time.Sleep(1100 * time.Millisecond) // the bucket has refilled; the ban holds
	for _, c := range []*testcaddy.Caddy{b, a} {
		if s, n := retry(c); s != 429 || n < 3500 {
			t.Fatalf("banned client on another instance: %d, Retry-After %d", s, n)
		}
	}
	if s, _, _ := func() (int, int, int) {
		resp, _ := get(t, b, "/", "X-API-Key", "someone-else")
		return resp.StatusCode, 0, 0
	}(); s != 200 {
		t.Fatalf("another client: %d", s)
	}
	if got := scrape(t, a, `caddy_rate_limit_bans_total{zone="api"}`); got != 1 {
		t.Fatalf("bans_total on the instance that banned: %v; want 1", got)
	}
	// A reset through the admin API lifts the ban.
	admin(t, b, "DELETE", "/rate_limit/zones/api/keys/offender")
	if s, _ := retry(b); s != 200 {
		t.Fatalf("after a reset: %d; want 200", s)
	}
}
