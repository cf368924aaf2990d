package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// BenchmarkServeHTTPParallel serves 64 clients at once (64 goroutines
// each with an API key of its own), as the load test's 64 connections,
// through the handler alone: with Redis, concurrent decisions are batched
// as they are under load. Besides ns/op (wall time per request across
// the goroutines), it reports cpu-ns/op: this process's CPU time (user and
// system, from getrusage) per request, the gateway's share without
// net/http, wrk or Redis, which run elsewhere or not at all.
func BenchmarkServeHTTPParallel(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		runParallelCPU(b, benchHandler(b, "par_mem", "{http.request.header.X-Key}", 1, "1000000000r/s"))
	})
	b.Run("redis_standalone", func(b *testing.B) {
		h := &Handler{Zones: map[string]*Zone{"par_redis": {Key: "{http.request.header.X-Key}", Rate: "1000000000r/s"}},
			Redis: &RedisConfig{Addresses: []string{redistest.StandaloneAddr(b)}}}
		if err := provision(b, h); err != nil {
			b.Fatal(err)
		}
		h.logger = infoLogger()
		runParallelCPU(b, h)
	})
	b.Run("redis_sync", func(b *testing.B) {
		runParallelCPU(b, syncHandler(b, "par_sync", "1000000000r/s"))
	})
}

// syncHandler is a handler of one zone of rate, keyed by X-Key, that
// syncs every 100ms through the standalone Redis, warm: it hands out
// shares (the Syncer decides in Redis until it is, a second). Its key
// prefix is its own, so that it counts itself alone, whatever instances
// other runs registered.
func syncHandler(b *testing.B, zone, rate string) *Handler {
	h := &Handler{Zones: map[string]*Zone{zone: {Key: "{http.request.header.X-Key}", Rate: rate, Sync: caddy.Duration(100 * time.Millisecond)}},
		Redis: &RedisConfig{Addresses: []string{redistest.StandaloneAddr(b)}, KeyPrefix: fmt.Sprintf("bsync%x:", rand.Uint64())}}
	if err := provision(b, h); err != nil {
		b.Fatal(err)
	}
	h.logger = infoLogger()
	serve(h, keyRequest("warm"))
	for deadline := time.Now().Add(10 * time.Second); !h.store.SyncReady(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the syncer did not warm up in 10s")
		}
	}
	return h
}

// runParallelCPU runs h from 64 goroutines and reports cpu-ns/op.
func runParallelCPU(b *testing.B, h *Handler) {
	var client atomic.Int64
	b.SetParallelism(max(64/max(1, testingProcs()), 1))
	b.ReportAllocs()
	before := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		s := newBenchServer(b, h, http.StatusOK)
		s.r = s.r.Clone(s.r.Context())
		s.r.Header.Set("X-Key", fmt.Sprint("client-", client.Add(1)))
		caddyhttp.NewTestReplacer(s.r)
		for pb.Next() {
			s.serve(b)
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-before)/float64(b.N), "cpu-ns/op")
}

// processCPU is this process's user and system CPU time so far, in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// testingProcs is GOMAXPROCS, which RunParallel multiplies by the
// parallelism.
func testingProcs() int { return runtime.GOMAXPROCS(0) }
