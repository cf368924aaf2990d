package e2e

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/compatconfigs"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// caddy-ratelimit's configurations (internal/compatconfigs, verbatim)
// through a real Caddy.

// send sends a request with method to path and returns the response and
// its body; a transport error fails the test.
func send(t *testing.T, c *testcaddy.Caddy, method, path string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, c.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// expectRetry sends a request and checks its status and Retry-After.
func expectRetry(t *testing.T, c *testcaddy.Caddy, method string, status int, retryAfter string) string {
	t.Helper()
	resp, body := send(t, c, method, "/")
	if resp.StatusCode != status || resp.Header.Get("Retry-After") != retryAfter {
		t.Fatalf("%s: status %d, Retry-After %q; want %d, %q (body %q)", method, resp.StatusCode, resp.Header.Get("Retry-After"), status, retryAfter, body)
	}
	return body
}

// loadJSON loads a JSON config, its admin and listen addresses those of
// c (caddy-ratelimit's tests use localhost:2999 and :8080).
func loadJSON(c *testcaddy.Caddy, config string) error {
	config = strings.NewReplacer(`"localhost:2999"`, fmt.Sprintf(`"127.0.0.1:%d"`, c.AdminPort),
		`":8080"`, fmt.Sprintf(`":%d"`, c.HTTPPort)).Replace(config)
	resp, err := http.Post(c.Admin+"/load", "application/json", strings.NewReader(config))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		_ = json.Unmarshal(body, &e) // the admin API's error, unescaped
		return fmt.Errorf("load: %s: %s", resp.Status, cmp.Or(e.Error, string(body)))
	}
	return nil
}

// TestCompatCaddyfile: caddy-ratelimit's TestCaddyfileRateLimits
// (caddyfile_test.go), its site's body verbatim: events 10, window 60s,
// on GET only. 10 GETs pass, the 11th gets Retry-After 60, a POST passes,
// and 30 s later Retry-After says 30 (in real time).
func TestCompatCaddyfile(t *testing.T) {
	t.Parallel()
	_, site, _ := strings.Cut(fmt.Sprintf(compatconfigs.TestCaddyfile, 60, 10), "localhost:8080")
	c := testcaddy.Start(t, site, "skip_install_trust")
	start := time.Now()
	for range 10 {
		expectRetry(t, c, "GET", 200, "")
	}
	expectRetry(t, c, "GET", 429, "60")
	expectRetry(t, c, "POST", 200, "")
	time.Sleep(time.Until(start.Add(30*time.Second + 200*time.Millisecond)))
	expectRetry(t, c, "GET", 429, "30")
}

// TestCompatJSON: the JSON configurations of caddy-ratelimit's tests
// (handler_test.go, metrics_test.go, distributed_test.go) loaded into a
// running Caddy through the admin API.
func TestCompatJSON(t *testing.T) {
	t.Parallel()
	c := testcaddy.Start(t, `respond "ok"`)
	if err := loadJSON(c, fmt.Sprintf(compatconfigs.TestRateLimits, 60, 10)); err != nil {
		t.Fatal(err)
	}
	// As with caddy-ratelimit: no limit headers on the allowed responses,
	// and an empty 429 (no handle_errors here) with Retry-After alone.
	if resp, _ := send(t, c, "GET", "/"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" || resp.Header.Get("RateLimit") != "" {
		t.Errorf("allowed: status %d, headers %v; want 200 without limit headers", resp.StatusCode, resp.Header)
	}
	for range 9 {
		expectRetry(t, c, "GET", 200, "")
	}
	if body := expectRetry(t, c, "GET", 429, "60"); body != "" {
		t.Errorf("429 body %q; want caddy-ratelimit's empty one", body)
	}

	if err := loadJSON(c, fmt.Sprintf(compatconfigs.TestMetrics, 10, 2)); err != nil {
		t.Fatal(err)
	}
	expectRetry(t, c, "GET", 200, "")
	expectRetry(t, c, "GET", 200, "")
	expectRetry(t, c, "GET", 429, "10")
	resp, err := http.Get(c.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`caddy_rate_limit_decisions_total{result="allowed",zone="test_zone"} 2`,
		`caddy_rate_limit_decisions_total{result="denied",zone="test_zone"} 1`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// distributed through the file system storage the config sets: this
	// instance alone in it admits the whole limit
	dir := t.TempDir()
	if err := loadJSON(c, fmt.Sprintf(compatconfigs.TestDistributed, dir, "peer_zone", 60, 10)); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		expectRetry(t, c, "GET", 200, "")
	}
	if resp, _ := send(t, c, "GET", "/"); resp.StatusCode != 429 {
		t.Fatalf("the 11th GET of 10 a minute: %d", resp.StatusCode)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "rate_limit", "sync", "*.json")); len(files) != 1 {
		t.Fatalf("the storage holds %v: want this instance's counts", files)
	}
}

// TestCompatHandleErrors: caddy-ratelimit's responses (a 429 error for
// handle_errors, {http.rate_limit.exceeded.name}, Retry-After alone) with
// response handle_errors and headers none; the zone is its README's
// dynamic_example.
func TestCompatHandleErrors(t *testing.T) {
	t.Parallel()
	c := testcaddy.Start(t, `
	rate_limit {
		response handle_errors
		headers  none
		zone dynamic_example {
			key    {remote_host}
			events 2
			window 5s
		}
	}
	respond "ok"
	handle_errors {
		respond "{err.status_code} {http.rate_limit.exceeded.name}"
	}
`)
	expectRetry(t, c, "GET", 200, "")
	expectRetry(t, c, "GET", 200, "")
	resp, body := send(t, c, "GET", "/")
	if resp.StatusCode != 429 || body != "429 dynamic_example" || resp.Header.Get("Retry-After") != "5" ||
		resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Fatalf("status %d, body %q, headers %v", resp.StatusCode, body, resp.Header)
	}
}

// failRegex reads the failregex of the fail2ban filter this module ships.
func failRegex(t *testing.T) (file, failregex string) {
	t.Helper()
	file, err := filepath.Abs("../../fail2ban/filter.d/caddy-rate-limit.conf")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "failregex = "); ok {
			return file, v
		}
	}
	t.Fatalf("no failregex in %s", file)
	return "", ""
}

// TestCompatRefusalLogFail2ban: log_refusals writes one info line per
// client and zone per interval, which the fail2ban filter of
// fail2ban/filter.d (the README's) matches, its <HOST> the client; and
// each refusal emits rate_limit_exceeded (seen in the events app's debug
// log: the test's Caddy runs with debug).
func TestCompatRefusalLogFail2ban(t *testing.T) {
	t.Parallel()
	c := testcaddy.Start(t, `
	rate_limit {
		log_refusals
		zone login {
			key    {client_ip}
			events 1
			window 1m
		}
	}
	respond "ok"
`)
	expectRetry(t, c, "GET", 200, "")
	expectRetry(t, c, "GET", 429, "60")
	expectRetry(t, c, "GET", 429, "60")
	c.WaitLogs(`"msg":"rate limit exceeded"`)
	logs := waitCount(c, `"name":"rate_limit_exceeded"`, 2)
	file, failregex := failRegex(t)
	// fail2ban's <HOST> for the addresses it bans.
	re := regexp.MustCompile(strings.Replace(failregex, "<HOST>", `(?P<host>[0-9A-Fa-f.:]+)`, 1))
	var matched, refusals, events []string
	for line := range strings.SplitSeq(logs, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			matched = append(matched, m[1])
		}
		if strings.Contains(line, `"msg":"rate limit exceeded"`) {
			refusals = append(refusals, line)
		}
		if strings.Contains(line, `"name":"rate_limit_exceeded"`) {
			events = append(events, line)
		}
	}
	if len(refusals) != 1 || len(matched) != 1 || matched[0] != "127.0.0.1" {
		t.Fatalf("refusal lines %q, the filter matched %q; want one line, its host 127.0.0.1", refusals, matched)
	}
	t.Logf("Caddy's line: %s", refusals[0])
	for _, want := range []string{`"level":"info"`, `"zone":"login"`, `"client_ip":"127.0.0.1"`, `"path":"/"`, `"retry_after":60`} {
		if !strings.Contains(refusals[0], want) {
			t.Errorf("refusal line %s lacks %s", refusals[0], want)
		}
	}
	if len(events) != 2 || !strings.Contains(events[0], `"origin":"http.handlers.rate_limit"`) ||
		!strings.Contains(events[0], `"zone":"login"`) || !strings.Contains(events[0], `"remote_ip":"127.0.0.1"`) {
		t.Errorf("events %q; want two rate_limit_exceeded from http.handlers.rate_limit", events)
	}
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil || !strings.Contains(string(doc), "failregex = "+failregex+"\n") {
		t.Errorf("docs/operations.md does not show the filter's failregex %q", failregex)
	}
	fail2banRegex(t, file, refusals[0])
}

// waitCount waits until Caddy's output holds substr n times, and returns
// it all.
func waitCount(c *testcaddy.Caddy, substr string, n int) string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		logs := c.Logs()
		if strings.Count(logs, substr) >= n || time.Now().After(deadline) {
			return logs
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fail2banRegex runs fail2ban's own fail2ban-regex, when installed, on a
// line Caddy wrote.
func fail2banRegex(t *testing.T, filter, line string) {
	t.Helper()
	bin, err := exec.LookPath("fail2ban-regex")
	if err != nil {
		t.Log("fail2ban-regex is not installed: the filter was checked with Go's regexp only")
		return
	}
	log := filepath.Join(t.TempDir(), "caddy.log")
	if err := os.WriteFile(log, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-v", log, filter).CombinedOutput()
	if err != nil {
		t.Fatalf("fail2ban-regex: %v\n%s", err, out)
	}
	var lines, host bool
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		lines = lines || strings.HasPrefix(sc.Text(), "Lines: 1 lines, 0 ignored, 1 matched, 0 missed")
		host = host || strings.HasPrefix(strings.TrimSpace(strings.TrimPrefix(sc.Text(), "|")), "127.0.0.1")
	}
	if !lines || !host {
		t.Fatalf("fail2ban-regex did not match 127.0.0.1 in Caddy's line:\n%s", out)
	}
	t.Logf("fail2ban-regex matched 127.0.0.1 in Caddy's line")
}

// TestCompatBehaviour: caddy-ratelimit's README Caddyfile example (its
// distributed line left out) behaves as with caddy-ratelimit: allowed
// responses carry no limit headers; a refusal is a 429 error that the
// site's handle_errors answers, with Retry-After alone; and it is logged
// at info level with caddy-ratelimit's message and fields, in its order
// (zone, wait, remote_ip, key with log_key). Setting our options
// (response json, headers) gives ours back.
func TestCompatBehaviour(t *testing.T) {
	t.Parallel()
	_, site, _ := strings.Cut(strings.Replace(compatconfigs.ReadmeCaddyfile, "\tdistributed\n", "", 1), ":80\n")
	site += "handle_errors {\n\trespond \"custom {err.status_code} {http.rate_limit.exceeded.name}\"\n}\n"
	c := testcaddy.Start(t, site)
	for range 2 {
		resp, _ := send(t, c, "POST", "/")
		if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" || resp.Header.Get("RateLimit") != "" {
			t.Fatalf("allowed: status %d, headers %v; want 200 without limit headers", resp.StatusCode, resp.Header)
		}
	}
	resp, body := send(t, c, "POST", "/")
	if resp.StatusCode != 429 || body != "custom 429 dynamic_example" || resp.Header.Get("Retry-After") != "5" ||
		resp.Header.Get("X-RateLimit-Remaining") != "" {
		t.Fatalf("refused: status %d, body %q, headers %v; want handle_errors' 429 with Retry-After 5 alone", resp.StatusCode, body, resp.Header)
	}
	line := c.WaitLogs(`"msg":"rate limit exceeded"`)
	re := regexp.MustCompile(`\{"level":"info","ts":[0-9.e+]+,"logger":"http\.handlers\.rate_limit","msg":"rate limit exceeded",` +
		`"zone":"dynamic_example","wait":[0-9.]+,"remote_ip":"127\.0\.0\.1","key":"127\.0\.0\.1"\}`)
	if !re.MatchString(line) {
		t.Fatalf("no caddy-ratelimit refusal line in:\n%s", line)
	}

	site = strings.Replace(site, "\tlog_key\n", "\tlog_key\n\tresponse json\n\theaders x_ratelimit\n", 1)
	if err := c.Reload(site); err != nil {
		t.Fatal(err)
	}
	// A kept-alive connection of the old server may still answer with the
	// old config (its handle_errors' 429): the next request goes on a new
	// one, as a new client's would.
	http.DefaultClient.CloseIdleConnections()
	resp, body = send(t, c, "GET", "/x") // a new config: the memory store keeps the bucket
	if resp.StatusCode != 429 || !strings.HasPrefix(body, "{") || resp.Header.Get("X-RateLimit-Limit") != "2" {
		t.Fatalf("with response json: status %d, body %q, headers %v; want our JSON 429", resp.StatusCode, body, resp.Header)
	}
}

// TestZoneNameReusedAtLoad: in JSON, two handlers that give one zone name
// different policies fail the load, naming both, and the running config
// stays; a reload that changes a zone's policy is no reuse: it loads.
func TestZoneNameReusedAtLoad(t *testing.T) {
	t.Parallel()
	c := testcaddy.Start(t, "rate_limit {\n\tzone per_ip {\n\t\tkey {client_ip}\n\t\trate 100r/m\n\t}\n}\nrespond ok")
	handler := func(rate string) string {
		return `{"handler":"rate_limit","zones":{"per_ip":{"key":"{http.request.remote.host}","rate":"` + rate + `"}}}`
	}
	config := `{"admin":{"listen":"localhost:2999"},"apps":{"http":{"servers":{"s":{"listen":[":8080"],"routes":[` +
		`{"match":[{"path":["/a"]}],"handle":[` + handler("100r/m") + `,{"handler":"static_response","body":"a"}]},` +
		`{"handle":[` + handler("3r/m") + `,{"handler":"static_response","body":"b"}]}]}}}}}`
	err := loadJSON(c, config)
	want := `zone "per_ip" is defined twice in this config with different policies: key {http.request.remote.host}, rate 100r/m, ` +
		`and key {http.request.remote.host}, rate 3r/m; zones of one name share their buckets`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("load: %v\nwant it to contain %q", err, want)
	}
	if resp, _ := send(t, c, "GET", "/"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "100" {
		t.Fatalf("after the refused load: status %d, limit %q; want the running config's 100", resp.StatusCode, resp.Header.Get("X-RateLimit-Limit"))
	}
	if err := c.Reload("rate_limit {\n\tzone per_ip {\n\t\tkey {client_ip}\n\t\trate 3r/m\n\t}\n}\nrespond ok"); err != nil {
		t.Fatalf("a reload with a new rate: %v", err)
	}
	if resp, _ := send(t, c, "GET", "/"); resp.Header.Get("X-RateLimit-Limit") != "3" {
		t.Fatalf("after the reload: limit %q; want 3", resp.Header.Get("X-RateLimit-Limit"))
	}
}
