package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/testcaddy"
)

// settleUpstream is an application behind Caddy: POST /login answers 200
// to the password "right" and 401 to any other (slowly, so that parallel
// attempts overlap), and /llm answers X-Tokens-Used: 400. It counts the
// wrong passwords that reached it.
type settleUpstream struct {
	srv   *httptest.Server
	wrong atomic.Int64
}

func newSettleUpstream(t *testing.T) *settleUpstream {
	u := new(settleUpstream)
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/login" && r.Header.Get("X-Password") == "right":
			io.WriteString(w, "welcome")
		case r.URL.Path == "/login":
			u.wrong.Add(1)
			time.Sleep(100 * time.Millisecond)
			w.WriteHeader(http.StatusUnauthorized)
		case r.URL.Path == "/llm":
			w.Header().Set("X-Tokens-Used", "400")
			io.WriteString(w, "an answer")
		}
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// settleSite limits logins to 5 failures a minute per client, and the
// LLM route to 1000 tokens a minute per API key, as the response says.
func settleSite(redisBlock, upstream string) string {
	return "\trate_limit {\n" + redisBlock + `
		zone login {
			match {
				method POST
				path /login
			}
			key  {http.request.header.X-Client}
			rate 5r/m
			count_status 401
		}
		zone llm {
			match {
				path /llm
			}
			key  {http.request.header.X-API-Key}
			rate 1000r/m
			cost_from_response X-Tokens-Used strip
		}
	}
	reverse_proxy ` + strings.TrimPrefix(upstream, "http://") + "\n"
}

// settleStores runs f against a Caddy on the memory store and one on the
// Redis Cluster.
func settleStores(t *testing.T, f func(t *testing.T, c *testcaddy.Caddy, u *settleUpstream)) {
	t.Run("memory", func(t *testing.T) {
		u := newSettleUpstream(t)
		f(t, testcaddy.Start(t, settleSite("", u.srv.URL)), u)
	})
	t.Run("cluster", func(t *testing.T) {
		u := newSettleUpstream(t)
		prefix := fmt.Sprintf("settle%d:", time.Now().UnixNano())
		f(t, testcaddy.Start(t, settleSite(redisBlock(prefix, redistest.ClusterAddrs(t)...), u.srv.URL)), u)
	})
}

// login posts a password as client and returns the response.
func login(t *testing.T, c *testcaddy.Caddy, client, password string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.URL+"/login", nil)
	req.Header.Set("X-Client", client)
	req.Header.Set("X-Password", password)
	resp, err := client_.Do(req)
	if err != nil {
		t.Errorf("POST /login: %v", err)
		return &http.Response{}
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

var client_ = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}

// TestCountStatusLogin: with count_status 401 and 5 per minute, right
// passwords never count (20 in a minute pass), 5 wrong ones pass and the
// 6th is refused with 429, without reaching the application; then the
// right password waits too (the check comes before the request).
func TestCountStatusLogin(t *testing.T) {
	settleStores(t, func(t *testing.T, c *testcaddy.Caddy, u *settleUpstream) {
		for i := range 20 {
			if resp := login(t, c, "alice", "right"); resp.StatusCode != http.StatusOK {
				t.Fatalf("right password %d: status %d; want 200", i+1, resp.StatusCode)
			}
		}
		for i := range 5 {
			resp := login(t, c, "alice", "wrong")
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("wrong password %d: status %d; want 401", i+1, resp.StatusCode)
			}
			if got, want := resp.Header.Get("X-RateLimit-Remaining"), strconv.Itoa(4-i); got != want {
				t.Fatalf("wrong password %d: X-RateLimit-Remaining %q; want %s", i+1, got, want)
			}
		}
		resp := login(t, c, "alice", "wrong")
		if resp.StatusCode != http.StatusTooManyRequests || u.wrong.Load() != 5 {
			t.Fatalf("6th wrong password: status %d, %d reached the application; want 429, 5", resp.StatusCode, u.wrong.Load())
		}
		if resp := login(t, c, "alice", "right"); resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("right password after 5 failures: status %d; want 429", resp.StatusCode)
		}
	})
}

// TestCountStatusParallel: after 10 right passwords (which do not
// count), 50 wrong passwords sent at once against a limit of 5: at most 5
// reach the application (each is charged before it goes on; the charge of
// a 401 stays), the others are refused.
func TestCountStatusParallel(t *testing.T) {
	settleStores(t, func(t *testing.T, c *testcaddy.Caddy, u *settleUpstream) {
		for i := range 10 {
			if resp := login(t, c, "mallory", "right"); resp.StatusCode != http.StatusOK {
				t.Fatalf("right password %d: status %d; want 200", i+1, resp.StatusCode)
			}
		}
		var wg sync.WaitGroup
		var refused atomic.Int64
		for range 50 {
			wg.Go(func() {
				if login(t, c, "mallory", "wrong").StatusCode == http.StatusTooManyRequests {
					refused.Add(1)
				}
			})
		}
		wg.Wait()
		if n := u.wrong.Load(); n > 5 || n < 1 || refused.Load() != 50-n {
			t.Fatalf("%d wrong passwords reached the application, %d refused; want at most 5, the rest refused", n, refused.Load())
		}
	})
}

// TestCostFromResponse: an upstream that answers X-Tokens-Used: 400
// against 1000 tokens a minute. Each request is checked with the zone's
// cost (1), then charged the header's 400: the third puts the bucket 200
// tokens into debt, and the next is refused with a Retry-After of the
// debt's repayment (200 tokens at 1000/m: 12s) plus its own token. The
// headers show the state after the charge; the cost header is stripped.
func TestCostFromResponse(t *testing.T) {
	settleStores(t, func(t *testing.T, c *testcaddy.Caddy, u *settleUpstream) {
		for i, want := range []int{600, 200, 0} {
			resp, _ := get(t, c, "/llm", "X-API-Key", "k1")
			remaining, _ := strconv.Atoi(resp.Header.Get("X-RateLimit-Remaining"))
			if resp.StatusCode != http.StatusOK || remaining < want || remaining > want+1 {
				t.Fatalf("request %d: status %d, X-RateLimit-Remaining %q; want 200, %d", i+1, resp.StatusCode,
					resp.Header.Get("X-RateLimit-Remaining"), want)
			}
			if v := resp.Header.Get("X-Tokens-Used"); v != "" {
				t.Fatalf("request %d: X-Tokens-Used %q reached the client; want it stripped", i+1, v)
			}
		}
		resp, _ := get(t, c, "/llm", "X-API-Key", "k1")
		retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != http.StatusTooManyRequests || retry < 12 || retry > 13 {
			t.Fatalf("request 4, in debt: status %d, Retry-After %q; want 429, 13 (12s of debt and 60ms for its token)",
				resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	})
}
