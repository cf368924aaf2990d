// Package e2e runs a real Caddy with the module and sends it real HTTP
// requests on loopback.
package e2e

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// get fails the test on a transport error.
func get(t *testing.T, c *testcaddy.Caddy, path string, headers ...string) (*http.Response, string) {
	t.Helper()
	resp, body, err := c.Get(path, headers...)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp, body
}

// expect checks the status and the X-RateLimit-Remaining header.
func expect(t *testing.T, resp *http.Response, status int, remaining string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("%s: status %d; want %d", resp.Request.URL.Path, resp.StatusCode, status)
	}
	if got := resp.Header.Get("X-RateLimit-Remaining"); got != remaining {
		t.Fatalf("%s: X-RateLimit-Remaining %q; want %q", resp.Request.URL.Path, got, remaining)
	}
}

const perIP = `
	rate_limit {
		zone api {
			key   {client_ip}
			rate  1r/m
			burst 3
		}
	}
	respond "ok {http.rate_limit.zone} {http.rate_limit.remaining}"
`

func TestAllowedThen429(t *testing.T) {
	c := testcaddy.Start(t, perIP)
	start := time.Now()
	for i, want := range []string{"2", "1", "0"} {
		resp, body := get(t, c, "/")
		expect(t, resp, 200, want)
		if resp.Header.Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("request %d: X-RateLimit-Limit %q; want 3", i, resp.Header.Get("X-RateLimit-Limit"))
		}
		if body != "ok api "+want {
			t.Fatalf("request %d: body %q: placeholders not set", i, body)
		}
		if resp.Header.Get("Retry-After") != "" {
			t.Fatalf("request %d: Retry-After on an allowed response", i)
		}
	}
	resp, body := get(t, c, "/")
	expect(t, resp, http.StatusTooManyRequests, "0")
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if retry < 59 || retry > 60 {
		t.Fatalf("Retry-After %q; want 60 (a token every minute)", resp.Header.Get("Retry-After"))
	}
	reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
	if lo, hi := start.Add(3*time.Minute).Unix(), time.Now().Add(3*time.Minute).Unix()+1; reset < lo || reset > hi {
		t.Fatalf("X-RateLimit-Reset %d; want in [%d, %d]: when 3 tokens are back", reset, lo, hi)
	}
	var r struct {
		Error, Message, Zone string
		RetryAfter           int `json:"retry_after"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	want := "You have exceeded the rate limit of 1 request per minute. Try again in " + strconv.Itoa(retry) + " seconds."
	if r.Error != "rate limit exceeded" || r.Zone != "api" || r.RetryAfter != retry || r.Message != want {
		t.Fatalf("body %q", body)
	}
}

func TestMatcherLimitsOnlyItsPaths(t *testing.T) {
	c := testcaddy.Start(t, `
	rate_limit {
		zone search {
			match {
				path /search*
			}
			key   {client_ip}
			rate  1r/h
			burst 1
		}
	}
	respond "ok"
`)
	expect(t, first(get(t, c, "/search?q=a")), 200, "0")
	expect(t, first(get(t, c, "/search?q=b")), 429, "0")
	for range 5 {
		resp, _ := get(t, c, "/profile")
		expect(t, resp, 200, "") // no zone applies: no headers
	}
}

// first is the first of two results.
func first[A, B any](a A, _ B) A { return a }

func TestTighterZoneDecides(t *testing.T) {
	c := testcaddy.Start(t, `
	rate_limit {
		zone loose {
			key   {client_ip}
			rate  100r/d
		}
		zone tight {
			match {
				path /tight
			}
			key   {client_ip}
			rate  2r/h
		}
	}
	respond "ok"
`)
	expect(t, first(get(t, c, "/tight")), 200, "1")
	expect(t, first(get(t, c, "/tight")), 200, "0")
	resp, body := get(t, c, "/tight")
	expect(t, resp, 429, "0")
	if resp.Header.Get("X-RateLimit-Limit") != "2" {
		t.Fatalf("headers describe the loose zone: %v", resp.Header)
	}
	var r struct{ Zone string }
	if json.Unmarshal([]byte(body), &r); r.Zone != "tight" {
		t.Fatalf("body names zone %q; want tight", r.Zone)
	}
	// Two passed both zones; the refusal took nothing from the loose one.
	expect(t, first(get(t, c, "/other")), 200, "97")
}

func TestKeysAreSeparate(t *testing.T) {
	c := testcaddy.Start(t, `
	rate_limit {
		zone per_key {
			key   {http.request.header.X-API-Key}
			rate  1r/h
		}
	}
	respond "ok"
`)
	expect(t, first(get(t, c, "/", "X-API-Key", "alice")), 200, "0")
	expect(t, first(get(t, c, "/", "X-API-Key", "alice")), 429, "0")
	expect(t, first(get(t, c, "/", "X-API-Key", "bob")), 200, "0")
	// No header: all such requests share one bucket.
	expect(t, first(get(t, c, "/")), 200, "0")
	expect(t, first(get(t, c, "/")), 429, "0")
}

func TestReloadKeepsCounters(t *testing.T) {
	c := testcaddy.Start(t, perIP)
	expect(t, first(get(t, c, "/")), 200, "2")
	expect(t, first(get(t, c, "/")), 200, "1")
	// Same zone, other routes and another zone: the api bucket is kept.
	if err := c.Reload(`
	rate_limit {
		zone api {
			key   {client_ip}
			rate  1r/m
			burst 3
		}
		zone other {
			match {
				path /other
			}
			key   {client_ip}
			rate  5r/m
		}
	}
	respond "reloaded"
`); err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, c, "/")
	expect(t, resp, 200, "0")
	if body != "reloaded" {
		t.Fatalf("body %q: reload not applied", body)
	}
	expect(t, first(get(t, c, "/")), 429, "0")
	// A changed zone keeps its tokens (none), capped at the new burst.
	if err := c.Reload(`
	rate_limit {
		zone api {
			key   {client_ip}
			rate  1r/m
			burst 10
		}
	}
	respond "ok"
`); err != nil {
		t.Fatal(err)
	}
	expect(t, first(get(t, c, "/")), 429, "0")
}
