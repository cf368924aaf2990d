package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestExceededNamePlaceholder: {http.rate_limit.exceeded.name} names the
// refusing zone, as in caddy-ratelimit, and is not set when allowed.
func TestExceededNamePlaceholder(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"tight": {Key: "k", MaxEvents: 1, Window: caddy.Duration(time.Minute)}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"", "tight"} {
		r := clientRequest("GET", "/", "10.0.0.1")
		repl := caddyhttp.NewTestReplacer(r)
		_ = h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
		if got, _ := repl.GetString("http.rate_limit.exceeded.name"); got != want {
			t.Fatalf("request %d: {http.rate_limit.exceeded.name} = %q; want %q", i, got, want)
		}
	}
}

// refusalLogHandler is a handler with log_refusals whose info logs a
// test reads; zones a and b (on /b) allow one request a minute per
// client address, keyed by an API key.
func refusalLogHandler(t *testing.T, logKeys bool) (*Handler, *observer.ObservedLogs, *fakeClock) {
	t.Helper()
	zone := func() *Zone {
		return &Zone{Key: "{http.request.header.X-API-Key}", MaxEvents: 1, Window: caddy.Duration(time.Minute)}
	}
	h := &Handler{LogRefusals: &RefusalLog{}, LogKeys: logKeys, Zones: map[string]*Zone{"a": zone(), "b": zone()}}
	h.Zones["a"].MatcherSetsRaw = caddyhttp.RawMatcherSets{{"path": json.RawMessage(`["/a"]`)}}
	h.Zones["b"].MatcherSetsRaw = caddyhttp.RawMatcherSets{{"path": json.RawMessage(`["/b"]`)}}
	clock := &fakeClock{t: time.Now()}
	h.now = clock.Now
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	h.logger = zap.New(core)
	return h, logs, clock
}

func TestRefusalLog(t *testing.T) {
	h, logs, clock := refusalLogHandler(t, false)
	send := func(path, client string) {
		r := clientRequest("GET", path, client)
		r.Header.Set("X-API-Key", "secret-key-"+client)
		serve(h, r)
	}
	for range 5 {
		send("/a", "10.0.0.1") // 1 allowed, 4 refused: one line
	}
	send("/b", "10.0.0.1")
	send("/b", "10.0.0.1") // another zone: a line
	send("/a", "10.0.0.2")
	send("/a", "10.0.0.2") // another client: a line
	clock.Advance(59 * time.Second)
	send("/a", "10.0.0.1") // within the interval: none
	if n := logs.Len(); n != 3 {
		t.Fatalf("%d lines; want 3: %v", n, logs.All())
	}
	clock.Advance(time.Second)
	send("/a", "10.0.0.1") // allowed again (the window passed)
	send("/a", "10.0.0.1") // refused, the interval passed: a line
	lines := logs.All()
	if len(lines) != 4 {
		t.Fatalf("%d lines; want 4", len(lines))
	}
	want := map[string]any{"zone": "a", "client_ip": "10.0.0.1", "remote_ip": "10.0.0.1", "host": "example.com",
		"method": "GET", "path": "/a", "retry_after": int64(60), "wait": time.Minute}
	got := lines[0].ContextMap()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("field %s = %v; want %v", k, got[k], v)
		}
	}
	for _, l := range lines {
		if l.Level != zap.InfoLevel || l.Message != "rate limit exceeded" {
			t.Errorf("line %v %q; want info \"rate limit exceeded\"", l.Level, l.Message)
		}
		if _, ok := l.ContextMap()["key"]; ok || strings.Contains(fmt.Sprint(l.ContextMap()), "secret-key") {
			t.Errorf("a key is logged without log_keys: %v", l.ContextMap())
		}
	}
	h, logs, _ = refusalLogHandler(t, true)
	for range 2 {
		r := clientRequest("GET", "/a", "10.0.0.9")
		r.Header.Set("X-API-Key", "k-9")
		serve(h, r)
	}
	if lines := logs.All(); len(lines) != 1 || lines[0].ContextMap()["key"] != "k-9" {
		t.Fatalf("with log_keys: %v; want one line with key k-9", lines)
	}
}

// TestRefusalLogSubnet: the throttle groups client addresses as the zone
// does, so that the addresses of one IPv6 /64 (one bucket) log one line
// per interval, not one each.
func TestRefusalLogSubnet(t *testing.T) {
	h, logs, _ := refusalLogHandler(t, false)
	for i := range 300 {
		r := clientRequest("GET", "/a", "")
		r.RemoteAddr = fmt.Sprintf("[2001:db8:0:1::%x]:4321", i+1)
		r.Header.Set("X-API-Key", "one-key")
		serve(h, r)
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d lines for 299 refusals of one /64; want 1", n)
	}
}

// TestRefusalThrottleBounded: a flood of distinct clients is remembered
// in at most two generations of the limit, and each of them logged once.
func TestRefusalThrottleBounded(t *testing.T) {
	th := newRefusalThrottle(time.Hour, 100)
	now := time.Now().UnixNano()
	for i := range 1000 {
		if !th.allow("z", "10.0."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256), now) {
			t.Fatalf("client %d not logged", i)
		}
		th.mu.Lock()
		n := len(th.cur) + len(th.prev)
		th.mu.Unlock()
		if n > 200 {
			t.Fatalf("%d digests remembered; want at most 200", n)
		}
	}
	if th.allow("z", "10.0.3.231", now) { // the last one: remembered
		t.Fatal("a client was logged twice within the interval")
	}
	if !th.allow("z", "10.0.3.231", now+int64(time.Hour)) {
		t.Fatal("a client was not logged again after the interval")
	}
}

// TestDryRunLoggedAtInfo: a dry-run zone's would-be refusals are logged
// at info level, where a rollout sees them, throttled as log_refusals is:
// one line per client and zone per interval.
func TestDryRunLoggedAtInfo(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"new_rule": {Key: "{http.request.remote.host}", MaxEvents: 1, Window: caddy.Duration(time.Minute), DryRun: true}}}
	core, logs := observer.New(zap.InfoLevel)
	h.logger = zap.New(core)
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	for _, client := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"} {
		if w := serve(h, clientRequest("GET", "/", client)); w.Code != http.StatusOK {
			t.Fatalf("a dry-run zone refused: %d", w.Code)
		}
	}
	lines := logs.FilterMessage("dry run: would be rate limited").All()
	if len(lines) != 2 {
		t.Fatalf("%d info lines for 3 would-be refusals of 2 clients; want 2 (one per client): %v", len(lines), logs.All())
	}
	if got := lines[0].ContextMap(); got["zone"] != "new_rule" || got["client_ip"] != "10.0.0.1" {
		t.Fatalf("line %v; want zone new_rule, client_ip 10.0.0.1", got)
	}
}

// TestBanLogged: the refusal that starts a ban is logged once at info
// level with the zone, the client's address and the ban's length; the
// key only with log_keys.
func TestBanLogged(t *testing.T) {
	for _, logKeys := range []bool{false, true} {
		core, logs := observer.New(zap.InfoLevel)
		h := &Handler{logger: zap.New(core), LogKeys: logKeys, Zones: map[string]*Zone{"login": {Key: "{http.request.header.X-Key}", Rate: "1r/d", // a refusal's own wait is longer than the ban
			Ban: &BanConfig{After: 2, Within: caddy.Duration(time.Minute), For: caddy.Duration(time.Hour)}}}}
		h.now = (&fakeClock{t: time.Unix(1_700_000_000, 0)}).Now
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		r := keyRequest(fmt.Sprint("secret-key-", logKeys)) // the memory store outlives the handler
		r.RemoteAddr = "192.0.2.7:1234"
		for range 5 {
			serve(h, r)
		}
		l := logs.FilterMessage("client banned").All()
		if len(l) != 1 {
			t.Fatalf("ban lines %v; want one", logs.All())
		}
		f := l[0].ContextMap()
		if f["zone"] != "login" || f["client_ip"] != "192.0.2.7" || f["for"] != time.Hour {
			t.Errorf("ban line %v; want zone login, client_ip 192.0.2.7, for 1h", f)
		}
		if _, ok := f["key"]; ok != logKeys {
			t.Errorf("log_keys %t: ban line %v", logKeys, f)
		}
	}
}

// TestLogRefusalsOff: log_refusals off writes no info line for refusals,
// not even caddy-ratelimit's in its spelling; an interval still parses.
func TestLogRefusalsOff(t *testing.T) {
	out, err := adapt(t, ":8080 {\n\trate_limit {\n\t\tlog_refusals off\n\t\tzone z {\n\t\t\tevents 1\n\t\t\twindow 1m\n\t\t}\n\t}\n}\n")
	if err != nil || !strings.Contains(out, `"log_refusals":{"off":true}`) {
		t.Fatalf("adapt: %v\n%s", err, out)
	}
	for _, bad := range []string{"log_refusals off 1m", "log_refusals never"} {
		if _, err := adapt(t, ":8080 {\n\trate_limit {\n\t\t"+bad+"\n\t\tzone z {\n\t\t\trate 1r/s\n\t\t}\n\t}\n}\n"); err == nil {
			t.Errorf("%s: adapted; want an error", bad)
		}
	}
	core, logs := observer.New(zap.InfoLevel)
	h := &Handler{logger: zap.New(core), LogRefusals: &RefusalLog{Off: true},
		Zones: map[string]*Zone{"quiet": {Key: "{http.request.header.X-Key}", MaxEvents: 1, Window: caddy.Duration(time.Minute)}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		serve(h, keyRequest("off"))
	}
	if l := logs.FilterMessage("rate limit exceeded").All(); len(l) != 0 {
		t.Fatalf("log_refusals off: %d refusal lines", len(l))
	}
}
