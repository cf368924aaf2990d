package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/clientkey"
)

// jwksFetchers holds the key sets fetched from JWKS URLs (jwt's jwks_url
// and discover), one per distinct resolved configuration, kept across
// config reloads: a reload neither fetches again nor drops the keys. A
// fetcher stops when the last handler using it is cleaned up.
var jwksFetchers = caddy.NewUsagePool()

// jwksFetcher is a key set in jwksFetchers.
type jwksFetcher struct {
	set *clientkey.RemoteKeySet
	// label names the set in metrics: the configured URL's host and path.
	label string
}

// Destruct stops the fetches, when the last handler using them is
// cleaned up.
func (f *jwksFetcher) Destruct() error {
	f.set.Stop()
	return nil
}

// Results of a fetch, the values of the "result" label of
// jwks_fetches_total.
const (
	jwksFetchOK       = "ok"       // fetched, and in use
	jwksFetchError    = "error"    // no answer, a timeout, an HTTP error status
	jwksFetchRejected = "rejected" // answered with a set that cannot be used
)

// loadJWKS acquires the key fetcher of h.JWT, if it has a JWKS URL or
// discovers one: a new one starts its first fetch.
func (h *Handler) loadJWKS() (*clientkey.RemoteKeySet, error) {
	o, err := h.JWT.remoteOptions()
	if err != nil || o == nil {
		return nil, err
	}
	key := fmt.Sprintf("%s|discover=%t|%s|%s|%s|%s|%d", o.URL, o.Discover, o.Timeout, o.RefreshMin, o.RefreshMax, o.MaxStale, o.MaxSize)
	label := jwksLabel(o.URL)
	o.Now, o.Report = h.now, reportJWKS(label)
	v, _, err := jwksFetchers.LoadOrNew(key, func() (caddy.Destructor, error) {
		set, err := clientkey.NewRemoteKeySet(*o)
		if err != nil {
			return nil, err
		}
		return &jwksFetcher{set: set, label: label}, nil
	})
	if err != nil {
		return nil, err
	}
	h.jwksKey = key
	return v.(*jwksFetcher).set, nil
}

// releaseJWKS releases h's key fetcher, once.
func (h *Handler) releaseJWKS() {
	if h.jwksKey == "" {
		return
	}
	if _, err := jwksFetchers.Delete(h.jwksKey); err != nil {
		h.logger.Error("stopping the JWKS fetches", zap.Error(err))
	}
	h.jwksKey = ""
}

// jwksLabel is the host and path of a configured URL: its label in
// metrics, from the config, never from a response.
func jwksLabel(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "invalid"
	}
	return u.Host + u.Path
}

// reportJWKS logs what a key fetcher reports and counts its fetches. It
// logs with Caddy's current logger: a fetcher outlives the config that
// started it.
func reportJWKS(label string) func(clientkey.Event) {
	return func(ev clientkey.Event) {
		log := caddy.Log().Named("http.handlers.rate_limit").With(zap.String("jwks", ev.URL))
		switch ev.Kind {
		case clientkey.Fetched:
			metrics.jwksFetches.WithLabelValues(label, jwksFetchOK).Inc()
			if !ev.Changed {
				log.Debug("jwks refreshed", zap.Int("keys", ev.Keys), zap.Duration("next", ev.Next))
				return
			}
			log.Info("jwks fetched: new keys in use", zap.Int("keys", ev.Keys), zap.Duration("next", ev.Next))
			for _, why := range ev.Skipped {
				log.Warn("jwks key skipped", zap.String("key", why))
			}
		case clientkey.FetchFailed:
			result := jwksFetchError
			if errors.Is(ev.Err, clientkey.ErrKeySetRejected) {
				result = jwksFetchRejected
			}
			metrics.jwksFetches.WithLabelValues(label, result).Inc()
			if ev.HasKeys {
				log.Warn("jwks fetch failed: the last keys stay in use", zap.Error(ev.Err),
					zap.Duration("keys_age", ev.Age), zap.Duration("retry_in", ev.Next))
				return
			}
			log.Error("jwks fetch failed: tokens yield no claims until keys arrive", zap.Error(ev.Err),
				zap.Duration("retry_in", ev.Next))
		case clientkey.KeysExpired:
			log.Error("jwks keys older than max_stale: tokens yield no claims until a fetch succeeds",
				zap.Duration("keys_age", ev.Age))
		}
	}
}

// jwksAgeCollector reports the age of the key set of each fetcher in use,
// as caddy_rate_limit_jwks_age_seconds{jwks="<host/path>"}: the time since
// its last good fetch, +Inf while it has none. Fetchers of one URL (with
// other intervals) report the youngest.
type jwksAgeCollector struct{ desc *prometheus.Desc }

func newJWKSAgeCollector() jwksAgeCollector {
	return jwksAgeCollector{prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, metricsSubsystem, "jwks_age_seconds"),
		"Age of the JWKS key set in use (since its last good fetch), +Inf while none was fetched, by configured URL (host and path).",
		[]string{"jwks"}, nil)}
}

// Describe implements prometheus.Collector.
func (c jwksAgeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c jwksAgeCollector) Collect(ch chan<- prometheus.Metric) {
	ages := map[string]float64{}
	jwksFetchers.Range(func(_, v any) bool {
		f := v.(*jwksFetcher)
		age := math.Inf(1)
		if a, ok := f.set.Age(); ok {
			age = max(a, time.Duration(0)).Seconds()
		}
		if old, seen := ages[f.label]; !seen || age < old {
			ages[f.label] = age
		}
		return true
	})
	for label, age := range ages {
		if m, err := prometheus.NewConstMetric(c.desc, prometheus.GaugeValue, age, label); err == nil {
			ch <- m
		}
	}
}
