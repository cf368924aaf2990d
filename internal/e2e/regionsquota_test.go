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
// through every Caddy in turn for 5 s: the regions together admit the
// quota, at most the bound each Caddy logs beyond it ((3 − 1) × ⌈20 / 3⌉
// = 14); then each Caddy refuses it with the day's headers: the zone's
// quota as the limit, and Retry-After until midnight UTC.
func (w *regionsWorld) quota() {
	w.t.Helper()
	if until := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)); until < time.Minute {
		w.t.Log("quota: too near midnight UTC, not run")
		return
	}
	n := len(w.caddys)
	p := w.pace(10, 50, 6*time.Second, func(i int) (int, string, string) { return i % n, "/quota", "quota-client" })
	p.Wait(50, 10*time.Second)
	shots := p.Stop()
	ok, sent := admitted(shots, "/quota")
	w.t.Logf("global quota: %d admitted of %d; the exact quota 20, bound 14", ok, sent)
	if ok < 20 || ok > 20+14 {
		w.t.Errorf("global quota: %d admitted of %d; want the quota, 20, and at most 14 more", ok, sent)
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
