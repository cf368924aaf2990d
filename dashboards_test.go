package ratelimit

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"
)

// exportedMetrics are the names of the series the module exports, with
// their labels: every collector in metrics, and the regions' (a
// histogram's _bucket, _sum and _count; its _bucket with le).
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	if err := registerMetrics(nil); err != nil { // initializes them all, once
		t.Fatal(err)
	}
	var collectors []prometheus.Collector
	v := reflect.ValueOf(&metrics).Elem()
	for i := range v.NumField() {
		if c, ok := reflect.NewAt(v.Field(i).Type(), v.Field(i).Addr().UnsafePointer()).Elem().Interface().(prometheus.Collector); ok {
			collectors = append(collectors, c)
		}
	}
	collectors = append(collectors, regionCollectors()...)
	names := map[string][]string{}
	desc := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	for _, c := range collectors {
		ch := make(chan *prometheus.Desc, 16)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := desc.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("unexpected Desc %s", d)
			}
			labels := strings.FieldsFunc(m[2], func(r rune) bool { return r == ',' })
			names[m[1]] = labels
			switch c.(type) {
			case *prometheus.HistogramVec, prometheus.Histogram:
				names[m[1]+"_bucket"] = append(slices.Clip(labels), "le")
				names[m[1]+"_sum"], names[m[1]+"_count"] = labels, labels
			}
		}
	}
	return names
}

// metricRef is a metric named in a PromQL expression, with the labels of
// its selector.
var metricRef = regexp.MustCompile(`\b(caddy_rate_limit_[a-z_]+)(\{[^}]*\})?`)

var (
	selectorLabel = regexp.MustCompile(`([a-z_]+)\s*(?:=~|!~|!=|=)`)
	groupingLabel = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"instance", "job"}

// checkExpr checks that expr names only exported metrics, with their own
// labels, and groups by labels that some metric has; it returns the
// metrics it names.
func checkExpr(t *testing.T, where, expr string, exported map[string][]string) []string {
	t.Helper()
	var named []string
	all := slices.Clone(targetLabels)
	for _, labels := range exported {
		all = append(all, labels...)
	}
	for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
		labels, ok := exported[m[1]]
		if !ok {
			t.Errorf("%s: %s is not a metric of the module", where, m[1])
			continue
		}
		named = append(named, m[1])
		for _, l := range selectorLabel.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(labels, l[1]) && !slices.Contains(targetLabels, l[1]) {
				t.Errorf("%s: %s has no label %q (it has %v)", where, m[1], l[1], labels)
			}
		}
	}
	for _, g := range groupingLabel.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(all, l) {
				t.Errorf("%s: grouping by %q, a label no metric has", where, l)
			}
		}
	}
	if len(named) == 0 {
		t.Errorf("%s: %q names no metric of the module", where, expr)
	}
	return named
}

// TestGrafanaDashboard: the dashboard parses, every query names metrics
// the module exports with their labels, and it shows what
// docs/operations.md promises: decisions by zone and result, refusals, store latency and
// errors, breakers, local cache hits, bans, region links.
func TestGrafanaDashboard(t *testing.T) {
	exported := exportedMetrics(t)
	data, err := os.ReadFile("dashboards/grafana-rate-limit.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, m := range checkExpr(t, "panel "+p.Title, q.Expr, exported) {
				used[m] = true
			}
		}
	}
	for _, m := range []string{"caddy_rate_limit_decisions_total", "caddy_rate_limit_store_duration_seconds_bucket",
		"caddy_rate_limit_store_errors_total", "caddy_rate_limit_script_errors_total", "caddy_rate_limit_circuit_breaker_open",
		"caddy_rate_limit_local_cache_hits_total", "caddy_rate_limit_bans_total", "caddy_rate_limit_store_error_decisions_total",
		"caddy_rate_limit_region_link_up", "caddy_rate_limit_region_last_exchange_timestamp_seconds"} {
		if !used[m] {
			t.Errorf("the dashboard does not show %s", m)
		}
	}
}

// TestPrometheusRules: the alerting rules parse, are complete, and name
// only exported metrics with their labels.
func TestPrometheusRules(t *testing.T) {
	exported := exportedMetrics(t)
	data, err := os.ReadFile("dashboards/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr, For string
				Labels           map[string]string
				Annotations      map[string]string
			}
		}
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatal(err)
	}
	alerts, severity := map[string]bool{}, map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			severity[r.Alert] = r.Labels["severity"]
			if r.Alert == "" || alerts[r.Alert] || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %q: want a unique alert name, a severity and a summary", r.Alert)
			}
			alerts[r.Alert] = true
			if _, err := time.ParseDuration(r.For); r.For != "" && err != nil {
				t.Errorf("rule %q: for %q: %v", r.Alert, r.For, err)
			}
			checkExpr(t, "rule "+r.Alert, r.Expr, exported)
		}
	}
	for _, a := range []string{"RateLimitFailureMode", "RateLimitCircuitBreakerOpen", "RateLimitStoreErrors", "RateLimitStoreSlow", "RateLimitSyncFailing", "RateLimitRegionLinkDown"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
	checkAlertTable(t, severity)
}

// checkAlertTable: docs/operations.md's table of alerts has a row for
// every alert of the rules, with its severity, and none other.
func checkAlertTable(t *testing.T, severity map[string]string) {
	t.Helper()
	doc, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for line := range strings.SplitSeq(string(doc), "\n") {
		name, ok := strings.CutPrefix(line, "| `RateLimit")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, "`")
		name = "RateLimit" + name
		rows[name] = true
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if sev, ok := severity[name]; !ok {
			t.Errorf("operations.md lists alert %s, which the rules do not have", name)
		} else if got := cells[len(cells)-1]; got != sev {
			t.Errorf("operations.md gives alert %s severity %q; the rules %q", name, got, sev)
		}
	}
	for name := range severity {
		if !rows[name] {
			t.Errorf("alert %s of the rules is not in operations.md's table of alerts", name)
		}
	}
}
