package e2e

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// quotaZone is the sites' global quota (see site): 20 a day, per client,
// across the three regions.
const quotaZone = "\t\tzone quota {\n\t\t\tmatch {\n\t\t\t\tpath /quota\n\t\t\t}\n\t\t\tkey {http.request.header.X-API-Key}\n" +
	"\t\t\tquota 20 per day\n\t\t\tglobal\n\t\t}\n"

// quota: one client of the global quota (20 a day) sends 10 a second
// through every Caddy in turn for 5 s, then one request a region's D
// (sync and timeout) apart while the quota has room: the regions together
// admit the quota, at most the bound each Caddy logs beyond it ((3 − 1) ×
// ⌈20 / 3⌉ = 14) (a client sent through every region at once may be
// refused within the quota while a region's share is spent, for a
// fraction of a second: the requests after the 5 s are what the exact
// quota still admits); then each Caddy refuses it with the day's headers:
// the zone's quota as the limit, and Retry-After until midnight UTC.
func (w *regionsWorld) quota() {
	w.t.Helper()
	if until := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)); until < time.Minute {
		w.t.Log("quota: too near midnight UTC, not run")
		return
	}
	n := len(w.caddys)
	p := w.pace(10, 50, 6*time.Second, func(i int) (int, string, string) { return i % n, "/quota", "quota-client" })
	p.Wait(50, 10*time.Second)
	ok, sent := admitted(p.Stop(), "/quota")
	late := 0
	for i := 0; ok+late < 20 && i < 5; i++ { // what the exact quota still admits
		time.Sleep(regionsSync + time.Second)
		if w.send(i%n, "/quota", "quota-client").status == http.StatusOK {
			late++
		}
	}
	w.t.Logf("global quota: %d admitted of %d in 5 s, then %d; the exact quota 20, bound 14", ok, sent, late)
	if ok+late < 20 || ok+late > 20+14 {
		w.t.Errorf("global quota: %d admitted of %d, then %d; want the quota, 20, and at most 14 more", ok, sent, late)
	}
	time.Sleep(2 * (regionsSync + time.Second)) // every region's charges told
	for i, c := range w.caddys {
		req, _ := http.NewRequest(http.MethodGet, c.URL+"/quota", nil)
		req.Header.Set("X-API-Key", "quota-client")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			w.t.Fatal(err)
		}
		resp.Body.Close()
		midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
		retry, _ := strconv.ParseFloat(resp.Header.Get("Retry-After"), 64)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-RateLimit-Limit") != "20" ||
			math.Abs(retry-time.Until(midnight).Seconds()) > 5 {
			w.t.Errorf("global quota, spent, through Caddy %d: %d, limit %q, Retry-After %q; want 429, 20, %.0f s (until midnight UTC)",
				i, resp.StatusCode, resp.Header.Get("X-RateLimit-Limit"), resp.Header.Get("Retry-After"), time.Until(midnight).Seconds())
		}
	}
}
