package ratelimit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// TestQuotaCaddyfileErrors: a quota's mistakes are adapt errors at their
// line.
func TestQuotaCaddyfileErrors(t *testing.T) {
	zone := func(body string) string {
		return ":8080 {\n\trate_limit {\n\t\tzone api {\n\t\t\tkey k\n" + body + "\n\t\t}\n\t}\n}\n"
	}
	cases := []struct{ name, src, want string }{
		{"quota 0", zone("\t\t\tquota 0 per day"), `zone "api": quota "0": want a whole number of requests from 1 to 1099511627776 per period, at Caddyfile:5`},
		{"unknown period", zone("\t\t\tquota 10 per fortnight"), `zone "api": quota: unknown period "fortnight" (want day, week, month or year), at Caddyfile:5`},
		{"no per", zone("\t\t\tquota 10 day"), `want quota <n> per day|week|month|year, such as quota 10000 per month, at Caddyfile:5`},
		{"unknown time zone", zone("\t\t\tquota 10 per day\n\t\t\ttime_zone Mars/Olympus"), `zone "api": time_zone: unknown time zone "Mars/Olympus" (want an IANA name such as Europe/Paris or America/New_York), at Caddyfile:6`},
		{"the host's time zone", zone("\t\t\tquota 10 per day\n\t\t\ttime_zone Local"), `zone "api": time_zone: "Local" is each host's own time zone, which may differ across a fleet: name it, such as Europe/Paris, at Caddyfile:6`},
		{"quota with rate", zone("\t\t\tquota 10 per day\n\t\t\trate 1r/s"), `zone "api": quota and a rate in one zone: use two zones, one with the quota and one with the rate (a request must pass both), at Caddyfile:6`},
		{"rate with quota", zone("\t\t\trate 1r/s\n\t\t\tquota 10 per day"), `use two zones, one with the quota and one with the rate (a request must pass both), at Caddyfile:6`},
		{"placeholder without default", zone("\t\t\tquota {http.vars.plan_quota} per month"), `give a default quota of at least 1 after the period, such as quota {http.vars.plan_quota} per month 1000, at Caddyfile:5`},
		{"default of a number", zone("\t\t\tquota 10 per month 20"), `the default after the period is for a quota from placeholders`},
		{"time_zone alone", zone("\t\t\trate 1r/s\n\t\t\ttime_zone UTC"), `need a quota: quota <n> per day|week|month|year, at Caddyfile:6`},
		{"sync with count_status", ":8080 {\n\trate_limit {\n\t\tredis {\n\t\t\taddresses 127.0.0.1:1\n\t\t}\n\t\tzone api {\n\t\t\tkey k\n\t\t\tquota 10 per day\n\t\t\tsync 1s\n\t\t\tcount_status 5\n\t\t}\n\t}\n}",
			`zone "api": sync does not apply with count_status or cost_from_response, which settle in Redis after each response`},
		{"burst", zone("\t\t\tquota 10 per day\n\t\t\tburst 5"), `algorithm, burst, nodelay and lease do not apply, at Caddyfile:6`},
		{"cost over the quota", zone("\t\t\tquota 10 per day\n\t\t\tcost 11"), `cost 11 is more than the quota, 10: every request would be refused, at Caddyfile:6`},
		{"cost_from_response", zone("\t\t\tquota 10 per day\n\t\t\tcost_from_response X-Cost"), `it needs token_bucket or leaky_bucket, not quota`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := adapt(t, c.src)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
	out, err := adapt(t, zone("\t\t\tquota {http.vars.plan_quota} per month 1000\n\t\t\ttime_zone America/New_York"))
	want := `"default_quota":1000,"key":"k","quota":"{http.vars.plan_quota}","quota_per":"month","time_zone":"America/New_York"`
	if err != nil || !strings.Contains(out, want) {
		t.Fatalf("adapted %s, %v; want %s", out, err, want)
	}
}

// TestQuotaResponses: a day's quota in Auckland through the handler: the
// headers count the day down, the refusal waits until the next local
// midnight and says when that is, and the count starts afresh then.
func TestQuotaResponses(t *testing.T) {
	akl, _ := time.LoadLocation("Pacific/Auckland")
	midnight := time.Date(2025, 6, 2, 0, 0, 0, 0, akl) // NZST, +12
	clock := &fakeClock{t: midnight.Add(-time.Hour)}
	h := &Handler{Headers: "both", now: clock.Now, Zones: map[string]*Zone{"quota_daily": {
		Key: "{http.request.header.X-API-Key}", Quota: "3", QuotaPer: "day", TimeZone: "Pacific/Auckland"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	req := func() *http.Request {
		r := clientRequest("GET", "/", "192.0.2.1")
		r.Header.Set("X-API-Key", "k1")
		return r
	}
	for i := range 3 {
		w := serve(h, req())
		if w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != []string{"2", "1", "0"}[i] ||
			w.Header().Get("X-RateLimit-Reset") != "1748779200" || w.Header().Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("request %d: %d %v", i, w.Code, w.Header())
		}
		if got := w.Header().Get("RateLimit-Policy"); got != `"quota_daily";q=3;w=86400` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
	}
	w := serve(h, req())
	var body map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	msg := "You have used the quota of 3 requests per day in Pacific/Auckland. It resets at 2025-06-02 00:00 NZST (Pacific/Auckland), in 3600 seconds."
	if w.Code != 429 || w.Header().Get("Retry-After") != "3600" || body["message"] != msg ||
		body["resets_at"] != "2025-06-02T00:00:00+12:00" || body["retry_after"] != 3600.0 {
		t.Fatalf("4th: %d %v %s", w.Code, w.Header(), w.Body)
	}
	clock.Advance(time.Hour)
	if w := serve(h, req()); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != "2" {
		t.Fatalf("after midnight: %d %v", w.Code, w.Header())
	}
}

// TestQuotaTiersAndCountStatus: a quota from a placeholder (a plan's), its
// default when the placeholder gives nothing; with count_status, the
// responses that do not count are given back to the period's count.
func TestQuotaTiersAndCountStatus(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{
		"plan": {Key: "{http.request.header.X-API-Key}", Quota: "{http.request.header.X-Plan-Quota}", DefaultQuota: 1, QuotaPer: "month"}}}
	errs := &Handler{Zones: map[string]*Zone{
		"errors": {Key: "{http.request.header.X-API-Key}", Quota: "1", QuotaPer: "week", CountStatus: []int{5}}}}
	if err := cmp.Or(provision(t, h), provision(t, errs)); err != nil {
		t.Fatal(err)
	}
	req := func(key, quota string) *http.Request {
		r := clientRequest("GET", "/", "192.0.2.1")
		r.Header.Set("X-API-Key", key)
		if quota != "" {
			r.Header.Set("X-Plan-Quota", quota)
		}
		return r
	}
	for i := range 3 { // 200s are given back
		if w := serve(errs, req("pro", "")); w.Code != 200 || w.Header().Get("X-RateLimit-Remaining") != "1" {
			t.Fatalf("errors, request %d: %v", i, w.Header())
		}
	}
	for i := range 5 {
		if w := serve(h, req("pro", "5")); w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "5" {
			t.Fatalf("pro request %d: %d %v", i, w.Code, w.Header())
		}
	}
	if w := serve(h, req("pro", "5")); w.Code != 429 {
		t.Fatalf("pro, 6th: %d", w.Code)
	}
	expectStatus(t, h, req("free", ""), 200, "")
	if w := serve(h, req("free", "")); w.Code != 429 || w.Header().Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("free, 2nd: %d %v", w.Code, w.Header())
	}
}

// TestQuotaLookup: the admin lookup of a key shows what it used of this
// period, what remains, when the period started and when it resets, in
// the zone's time zone (on the wall clock, as the store's peek reads it).
func TestQuotaLookup(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"quota_lookup": {
		Key: "{http.request.header.X-API-Key}", Quota: "5", QuotaPer: "day", TimeZone: "Pacific/Auckland"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	akl, _ := time.LoadLocation("Pacific/Auckland")
	y, m, d := time.Now().In(akl).Date()
	start, end := time.Date(y, m, d, 0, 0, 0, 0, akl), time.Date(y, m, d+1, 0, 0, 0, 0, akl)
	for range 3 {
		r := clientRequest("GET", "/", "192.0.2.1")
		r.Header.Set("X-API-Key", "k1")
		serve(h, r)
	}
	u := lookup(t, "quota_lookup", "k1")
	if !time.Now().Before(end) {
		t.Skip("midnight in Auckland came during the test")
	}
	if field(u, "used") != "3" || field(u, "remaining") != "2" || field(u, "period_start") != `"`+start.Format(time.RFC3339)+`"` ||
		field(u, "resets_at") != `"`+end.Format(time.RFC3339)+`"` {
		t.Fatalf("lookup: %v", u)
	}
}

// TestQuotaOverridesAndDryRun: a key's override gives a customer its own
// quota (in memory and Redis), a rate is refused for a quota zone, and a
// quota zone in dry run never refuses.
func TestQuotaOverridesAndDryRun(t *testing.T) {
	stores := map[string]*RedisConfig{"memory": nil,
		"redis": {Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("quota%x:", rand.Uint64())}}
	for store, redis := range stores {
		t.Run(store, func(t *testing.T) {
			h, zone := overrideZone(t, &Zone{Quota: "2", QuotaPer: "month", TimeZone: "Europe/Paris"}, redis)
			mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"big","quota":5}`)
			if ok := passes(h, "big", 7); ok != 5 {
				t.Fatalf("the key with its own quota of 5 passed %d of 7", ok)
			}
			if ok := passes(h, "small", 4); ok != 2 {
				t.Fatalf("a key of the zone's quota of 2 passed %d of 4", ok)
			}
			if u := lookup(t, zone, "big"); field(u, "used") != "5" || field(u, "limit") != "5" || !strings.Contains(field(u, "key_override"), `"quota":5`) {
				t.Fatalf("lookup of big: %v", u)
			}
			var listing struct {
				Keys []struct {
					Digest string
					Used   int64
				}
			}
			if err := json.Unmarshal([]byte(mustAdmin(t, "GET", "/rate_limit/zones/"+zone+"/usage?top=1", "")), &listing); err != nil ||
				len(listing.Keys) != 1 || listing.Keys[0].Used != 5 {
				t.Fatalf("usage, top 1: %+v, %v", listing, err)
			}
			status, out := adminCall(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"other","rate":"10r/m"}`)
			if status != http.StatusBadRequest || !strings.Contains(out, "a quota zone takes quota, not rate or burst") {
				t.Fatalf("a rate on a quota zone: %d %s", status, out)
			}
		})
	}
	dry := &Handler{Zones: map[string]*Zone{"quota_dry": {Key: "{http.request.header.X-Key}", Quota: "1", QuotaPer: "year", DryRun: true}}}
	if err := provision(t, dry); err != nil {
		t.Fatal(err)
	}
	if ok := passes(dry, "k", 3); ok != 3 {
		t.Fatalf("dry run passed %d of 3", ok)
	}
}

// TestQuotaLookupUsedBeyondQuota: a lookup's used is the period's count as
// the store holds it, not the quota in force less what remains, which
// cannot exceed the quota: a key that used 5 under its own quota (an
// override, or a plan's from a placeholder, which a lookup does not see)
// shows 5 of the zone's 2, in memory and in Redis.
func TestQuotaLookupUsedBeyondQuota(t *testing.T) {
	stores := map[string]*RedisConfig{"memory": nil,
		"redis": {Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("quota%x:", rand.Uint64())}}
	for store, redis := range stores {
		t.Run(store, func(t *testing.T) {
			h, zone := overrideZone(t, &Zone{Quota: "2", QuotaPer: "month"}, redis)
			mustAdmin(t, "PUT", "/rate_limit/overrides/"+zone+"/key", `{"key":"big","quota":5}`)
			if ok := passes(h, "big", 5); ok != 5 {
				t.Fatalf("the key with its own quota of 5 passed %d of 5", ok)
			}
			mustAdmin(t, "DELETE", "/rate_limit/overrides/"+zone+"/key", `{"key":"big"}`)
			if u := lookup(t, zone, "big"); field(u, "used") != "5" || field(u, "remaining") != "0" || field(u, "limit") != "2" {
				t.Fatalf("lookup of big under the zone's quota of 2: %v", u)
			}
		})
	}
}

// TestQuotaSync: a quota syncs as a window does: through the handler on
// Redis, a day's quota of 3 admits 3 of a key and refuses the 4th until
// the next midnight, with the period's headers. (The fleet's accuracy
// against an exact replay: TestSyncAccuracyQuota in limiter/fleetsync.)
func TestQuotaSync(t *testing.T) {
	h := &Handler{Zones: map[string]*Zone{"daily": {Key: "{http.request.header.X-Key}", Quota: "3", QuotaPer: "day", Sync: caddy.Duration(100 * time.Millisecond)}},
		Redis: &RedisConfig{Addresses: []string{redistest.StandaloneAddr(t)}, KeyPrefix: fmt.Sprintf("qs%x:", rand.Uint64())}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	_, end := bucket.Calendar{Unit: bucket.Day}.Bounds(time.Now())
	if time.Until(end) < 10*time.Second {
		t.Skip("midnight UTC would come during the test")
	}
	if ok := passes(h, "k", 5); ok != 3 {
		t.Fatalf("a day's quota of 3 that syncs passed %d of 5", ok)
	}
	w := serve(h, keyRequest("k"))
	retry, _ := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 64)
	if w.Code != 429 || w.Header().Get("X-RateLimit-Reset") != strconv.FormatInt(end.Unix(), 10) || math.Abs(float64(retry)-time.Until(end).Seconds()) > 5 {
		t.Fatalf("refused: %d %v; want 429 until %s", w.Code, w.Header(), end)
	}
}
