package ratelimit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestDisableMetrics: a handler with disable_metrics counts no decisions.
func TestDisableMetrics(t *testing.T) {
	h := &Handler{DisableMetrics: true, Zones: map[string]*Zone{"quiet_zone": {Key: "k", Rate: "1r/m"}}}
	if err := provision(t, h); err != nil {
		t.Fatal(err)
	}
	before := metricCount(t, "quiet_zone")
	serve(h, crlRequest("GET", "/", "10.0.0.1"))
	serve(h, crlRequest("GET", "/", "10.0.0.1"))
	if after := metricCount(t, "quiet_zone"); after != before {
		t.Fatalf("decisions of quiet_zone went from %v to %v", before, after)
	}
	h2 := &Handler{Zones: map[string]*Zone{"loud_zone": {Key: "k", Rate: "1r/m"}}}
	if err := provision(t, h2); err != nil {
		t.Fatal(err)
	}
	serve(h2, crlRequest("GET", "/", "10.0.0.1"))
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
