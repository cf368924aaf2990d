package ratelimit

import "github.com/prometheus/client_golang/prometheus"

// regionMetrics are the collectors of the links to the peer regions
// (regionsstore.go), labelled by peer region: as many as the config
// names.
var regionMetrics struct {
	linkUp, heard, lastExchange       *prometheus.GaugeVec
	differs                           *prometheus.GaugeVec
	exchanges, exchangedKeys, dropped *prometheus.CounterVec
	exchangeDuration                  *prometheus.HistogramVec
}

func initRegionMetrics() {
	const ns, sub = metricsNamespace, metricsSubsystem
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, []string{"region"})
	}
	m := &regionMetrics
	m.linkUp = gauge("region_link_up",
		"1 while the link to a peer region is up (an exchange succeeded within 2 × (sync + timeout), and fewer than 3 of the last 10 failed), 0 while it is down or degraded and the global zones decide with this region's share.")
	m.heard = gauge("region_heard",
		"1 while a peer region's mark is in this region's Redis (it exchanged within 2 × (sync + timeout)), 0 while it is missing and the global zones count that region at its share.")
	m.differs = gauge("region_config_differs",
		"1 while a peer region's fingerprint (its key_secret, its global zones' keys, algorithms, rates and bursts) differs from this region's: the global zones decide with this region's share and charge it nothing; 0 while they agree.")
	m.lastExchange = gauge("region_last_exchange_timestamp_seconds",
		"When the last exchange with a peer region succeeded (Unix time): the lag of what this instance told it is the time since.")
	m.exchanges = counterVec("region_exchanges_total",
		"Exchanges with a peer region's Redis (this instance's admissions in global zones charged there, and its mark), by region and result: ok or error.", "region", "result")
	m.exchangedKeys = counterVec("region_exchanged_keys_total",
		"Buckets of global zones whose admissions this instance charged to a peer region's Redis.", "region")
	m.dropped = counterVec("region_dropped_keys_total",
		"Buckets whose admissions were not told to a peer region: its link was down (the peer counted this region at its share meanwhile); with region all, requests not counted because more buckets than an instance keeps were waiting.", "region")
	m.exchangeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "region_exchange_duration_seconds",
		Help:    "Time an exchange with a peer region took, errors included.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10),
	}, []string{"region"})
}

// regionCollectors are the collectors to register.
func regionCollectors() []prometheus.Collector {
	m := &regionMetrics
	return []prometheus.Collector{m.linkUp, m.heard, m.differs, m.lastExchange, m.exchanges, m.exchangedKeys, m.dropped, m.exchangeDuration}
}

// deleteRegionSeries deletes the series of peer region name.
func deleteRegionSeries(name string) {
	if regionMetrics.linkUp == nil {
		return // never initialised: no handler registered the metrics
	}
	m := &regionMetrics
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{m.linkUp, m.heard, m.differs, m.lastExchange, m.exchanges, m.exchangedKeys, m.dropped, m.exchangeDuration} {
		v.DeletePartialMatch(prometheus.Labels{"region": name})
	}
}
