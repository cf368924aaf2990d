package ratelimit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// TestDisableMetrics: a handler with disable_metrics counts no decisions.
func TestDisableMetrics(t *testing.T) {
	h := &Handler{DisableMetrics: true, Zones: map[string]*Zone{"quiet_zone": {Key: "k", Rate: "1r/m"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	before := metricCount(t, "quiet_zone")
	serve(h, clientRequest("GET", "/", "10.0.0.1"))
	serve(h, clientRequest("GET", "/", "10.0.0.1"))
	if after := metricCount(t, "quiet_zone"); after != before {
		t.Fatalf("decisions of quiet_zone went from %v to %v", before, after)
	}
	h2 := &Handler{Zones: map[string]*Zone{"loud_zone": {Key: "k", Rate: "1r/m"}}}
	if err := provision(t, h2); err != nil {
		t.Fatal(err)
	}
	serve(h2, clientRequest("GET", "/", "10.0.0.1"))
	if metricCount(t, "loud_zone") == 0 {
		t.Fatal("a handler without disable_metrics counted nothing")
	}
}

// metricCount sums caddy_rate_limit_decisions_total of a zone.
func metricCount(t *testing.T, zone string) float64 {
	t.Helper()
	var sum float64
	for _, result := range []string{resultNames[allowedIndex], resultNames[deniedIndex]} {
		c, err := metrics.decisions.GetMetricWithLabelValues(zone, result)
		if err != nil {
			t.Fatal(err)
		}
		sum += testutil.ToFloat64(c)
	}
	return sum
}

// TestFallbackDecisionsCounted: while Redis fails, decisions_total counts
// store_error, and store_error_decisions_total what on_store_error
// decided: with local, the memory store's allowed and denied.
func TestFallbackDecisionsCounted(t *testing.T) {
	for _, mode := range []string{"local", "deny", "allow"} {
		zone := "fallback_" + mode
		h := &Handler{Zones: map[string]*Zone{zone: {Key: "{http.request.header.X-Key}", Rate: "1r/m", Burst: "2"}},
			Redis: &RedisConfig{Addresses: []string{"127.0.0.1:1"}}, OnStoreError: &StoreErrorPolicy{Mode: mode}} // nothing listens
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			serve(h, keyRequest("k"))
		}
		count := func(vec interface {
			GetMetricWithLabelValues(...string) (prometheus.Counter, error)
		}, labels ...string) float64 {
			c, err := vec.GetMetricWithLabelValues(labels...)
			if err != nil {
				t.Fatal(err)
			}
			return testutil.ToFloat64(c)
		}
		want := map[string][2]float64{"local": {2, 3}, "deny": {0, 5}, "allow": {5, 0}}[mode]
		allowed, denied := count(metrics.fallbackDecisions, zone, "allowed"), count(metrics.fallbackDecisions, zone, "denied")
		if allowed != want[0] || denied != want[1] || count(metrics.decisions, zone, "store_error") != 5 {
			t.Errorf("%s: store_error_decisions_total allowed %v, denied %v, decisions_total store_error %v; want %v, 5",
				mode, allowed, denied, count(metrics.decisions, zone, "store_error"), want)
		}
	}
}

// TestStoreErrorsFromStart: a handler on Redis has its series of
// store_errors_total from its start, at 0, so that a rate over it and
// alerts work before the first error.
func TestStoreErrorsFromStart(t *testing.T) {
	if err := provision(t, &Handler{Zones: map[string]*Zone{"z": {Key: "k", Rate: "1r/m"}}}); err != nil { // the metrics made
		t.Fatal(err)
	}
	metrics.storeErrors.Reset()
	h := &Handler{Redis: &RedisConfig{Addresses: []string{redistest.StandaloneAddr(t)}}, Zones: map[string]*Zone{"z": {Key: "k", Rate: "1r/m"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	n := testutil.CollectAndCount(metrics.storeErrors) // before a lookup, which makes the series
	c, err := metrics.storeErrors.GetMetricWithLabelValues("redis")
	if err != nil || n != 1 || testutil.ToFloat64(c) != 0 {
		t.Errorf("store_errors_total after a start on Redis: %d series (%v); want one, at 0", n, err)
	}
}
