package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// idlePeer is a peer region that is never reached within a benchmark
// (the exchanges run every hour): what it costs is the request path's.
type idlePeer struct{}

func (idlePeer) ChargeAll(context.Context, []bucket.Request) ([]bucket.Decision, error) {
	return nil, nil
}
func (idlePeer) Groups(context.Context, []bucket.Request) [][]int                { return nil }
func (idlePeer) MarkRegion(context.Context, string, string, time.Duration) error { return nil }
func (idlePeer) Ping(context.Context) error                                      { return nil }
func (idlePeer) Ban(context.Context, bucket.Request, time.Duration) error        { return nil }
func (idlePeer) Prepare(context.Context) error                                   { return nil }
func (idlePeer) RegionMarks(context.Context, []string, int) ([]string, error)    { return nil, nil }

// BenchmarkDecideGlobal: the request path of a zone, and of the same zone
// global (its policy scaled, what it admits counted for the peers), on the
// memory store, 10,000 keys in turn. It is package limiter's, not
// limiter/regions': what it measures is decideGlobal (regions.go), and
// the idle peers are handed to the Limiter here (useRegions), as
// limiter.New, whose regions dial Redis, cannot.
func BenchmarkDecideGlobal(b *testing.B) {
	p := Policy{Algorithm: TokenBucket, Rate: 1 << 40, Period: time.Second, Burst: 1 << 40}
	reqs0 := make([]Request, 10000) // with their digests, as the handler makes them
	for i := range reqs0 {
		reqs0[i] = Request{Zone: "api", Key: fmt.Sprint("key-", i), Policy: p, Cost: 1}.WithDigest(nil)
	}
	for _, global := range []bool{false, true} {
		b.Run(fmt.Sprintf("global=%v", global), func(b *testing.B) {
			l := mustNew(b, Config{})
			defer l.Close()
			if global {
				useRegions(l, regions.New(regions.Config{This: "eu", Home: idlePeer{}, Peers: map[string]regions.Peer{"us": idlePeer{}, "ap": idlePeer{}},
					Interval: time.Hour, Timeout: time.Second}))
			}
			reqs := make([]Request, 1)
			var v Verdict
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				reqs[0] = reqs0[i%len(reqs0)]
				reqs[0].Global = global
				l.Decide(context.Background(), time.Time{}, reqs, Caller{}, &v)
				v.Release()
				i++
			}
		})
	}
}
