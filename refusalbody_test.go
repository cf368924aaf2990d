package ratelimit

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// refusal is a 429's JSON body, as clients parse it.
type refusal struct {
	Error       string `json:"error"`
	Message     string `json:"message"`
	Detail      string `json:"detail"`
	Zone        string `json:"zone"`
	RetryAfter  *int64 `json:"retry_after"`
	Banned      bool   `json:"banned"`
	BannedUntil int64  `json:"banned_until"`
	Cost        int64  `json:"cost"`
	Limit       int64  `json:"limit"`
}

func decodeRefusal(t *testing.T, w *http.Response, body string) refusal {
	t.Helper()
	if w.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d; want 429 (%s)", w.StatusCode, body)
	}
	var r refusal
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if n, _ := strconv.Atoi(w.Header.Get("Content-Length")); n != len(body) {
		t.Fatalf("Content-Length %q for a body of %d bytes", w.Header.Get("Content-Length"), len(body))
	}
	return r
}

// TestBanRefusalSaysBanned: the refusal that starts a ban and those of
// the ban say that the client is banned, and until when, in the JSON body
// and in problem details, and keep error, message, zone and retry_after;
// in memory and in Redis. A key's block says so too.
func TestBanRefusalSaysBanned(t *testing.T) {
	stores := map[string]*RedisConfig{"memory": nil,
		"redis": {Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("ban%x:", rand.Uint64())}}
	for store, redis := range stores {
		for _, response := range []string{"json", "problem"} {
			t.Run(store+"/"+response, func(t *testing.T) {
				zone := fmt.Sprintf("ban_%x", rand.Uint64())
				h := &Handler{Response: response, Redis: redis, Zones: map[string]*Zone{zone: {Key: "{http.request.header.X-Key}", Rate: "2r/m",
					Ban: &BanConfig{After: 1, Within: caddy.Duration(time.Minute), For: caddy.Duration(time.Hour)}}}}
				if err := provision(t, h); err != nil {
					t.Fatal(err)
				}
				passes(h, "c", 2)
				for i := range 2 { // the refusal that starts the ban, then one of the ban
					start := time.Now()
					rec := serve(h, keyRequest("c"))
					r := decodeRefusal(t, rec.Result(), rec.Body.String())
					text := r.Message + r.Detail
					until := time.Unix(r.BannedUntil, 0)
					if !r.Banned || until.Before(start.Add(time.Hour-time.Minute)) || until.After(time.Now().Add(time.Hour+time.Second)) {
						t.Errorf("refusal %d: banned %v until %v; want banned for an hour", i, r.Banned, until)
					}
					if !strings.Contains(text, "banned") || strings.Contains(text, "You have exceeded the rate limit") {
						t.Errorf("refusal %d says %q; want it to say the client is banned", i, text)
					}
					if r.Error+fmt.Sprint(r.Detail != "") != map[string]string{"json": "rate limit exceededfalse", "problem": "true"}[response] ||
						r.Zone != zone || r.RetryAfter == nil || *r.RetryAfter < 3590 || rec.Header().Get("Retry-After") != strconv.FormatInt(*r.RetryAfter, 10) {
						t.Errorf("refusal %d: %+v, Retry-After %q; want the fields clients parse", i, r, rec.Header().Get("Retry-After"))
					}
				}
			})
		}
	}
	t.Run("block", func(t *testing.T) {
		h, zone := overrideZone(t, &Zone{Rate: "2r/m"}, nil)
		mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"bad","block":true,"expires_in":"1h"}`)
		rec := serve(h, keyRequest("bad"))
		r := decodeRefusal(t, rec.Result(), rec.Body.String())
		if !r.Banned || r.BannedUntil < time.Now().Add(59*time.Minute).Unix() || !strings.Contains(r.Message, "blocked") {
			t.Errorf("a blocked key's refusal: %+v; want banned until the block's end, and a message that says blocked", r)
		}
	})
}

// TestImpossibleCostRefusal: a request whose cost exceeds the limit is
// refused with a body that names its cost and the limit, and without
// Retry-After or retry_after: waiting never lets it pass. It is shown
// over another zone's refusal that does give a time. A request that can
// pass later keeps its Retry-After.
func TestImpossibleCostRefusal(t *testing.T) {
	for _, response := range []string{"json", "problem", "handle_errors"} {
		t.Run(response, func(t *testing.T) {
			prefix := fmt.Sprintf("cost_%x_", rand.Uint64())
			h := &Handler{Response: response, Zones: map[string]*Zone{
				prefix + "api":  {Key: "{http.request.header.X-Key}", Rate: "10r/s", Burst: "10", Cost: "{http.request.header.X-Cost}", DefaultCost: 1},
				prefix + "hour": {Key: "{http.request.header.X-Key}", Rate: "1r/h", Algorithm: "fixed_window"}}}
			if err := provision(t, h); err != nil {
				t.Fatal(err)
			}
			for i, key := range []string{"alone", "drained"} {
				if i == 1 {
					serve(h, keyRequest(key)) // the hour's one request: the hour zone refuses next
				}
				r := keyRequest(key)
				r.Header.Set("X-Cost", "1000")
				rec := serve(h, r)
				if ra := rec.Header().Get("Retry-After"); rec.Code != http.StatusTooManyRequests || ra != "" {
					t.Fatalf("%s: a request of cost 1000: %d, Retry-After %q; want 429 and none", key, rec.Code, ra)
				}
				if response == "handle_errors" {
					continue
				}
				b := decodeRefusal(t, rec.Result(), rec.Body.String())
				text := b.Message + b.Detail
				if b.Cost != 1000 || b.Limit != 10 || b.RetryAfter != nil || b.Zone != prefix+"api" ||
					!strings.Contains(text, "1000") || !strings.Contains(text, "10") || strings.Contains(text, "Try again") {
					t.Errorf("%s: %s; want cost 1000, limit 10, no retry_after, and a message that names both and promises no retry", key, rec.Body)
				}
			}
			rec := serve(h, keyRequest("drained"))
			if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
				t.Fatalf("a request that can pass later: %d, Retry-After %q; want 429 with one", rec.Code, rec.Header().Get("Retry-After"))
			}
		})
	}
}
