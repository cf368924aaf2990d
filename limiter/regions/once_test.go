package regions_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// lossyPeer is a peer's real Redis behind a link that loses, of every
// fifth charge, the request (it never runs) or, alternately, the reply
// (it runs): either way the sender sees a time-out, which may have run.
type lossyPeer struct {
	*redisstore.Store
	mu    sync.Mutex
	calls int
	clean bool // no more losses
}

var errLost = fmt.Errorf("lost on the link: %w", context.DeadlineExceeded)

func (p *lossyPeer) ChargeAll(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	p.mu.Lock()
	p.calls++
	n, clean := p.calls, p.clean
	p.mu.Unlock()
	switch {
	case clean || n%5 != 0:
		return p.Store.ChargeAll(ctx, reqs)
	case n%10 == 0: // the request is lost
		return nil, errLost
	}
	_, err := p.Store.ChargeAll(ctx, reqs) // the reply is lost
	return nil, errors.Join(errLost, err)
}

// TestChargesInDoubtRunOnce: an exchange whose charges time out, having
// run or not, charges them again until they are known to have run, and
// the peer applies each once: after the traffic, every bucket in the
// peer holds exactly what this region admitted; a quota's count too.
func TestChargesInDoubtRunOnce(t *testing.T) {
	quota := bucket.Policy{Algorithm: bucket.Quota, Rate: 10000, Burst: 10000, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	if _, end := quota.Calendar.Bounds(time.Now()); time.Until(end) < time.Minute {
		t.Skip("too near midnight UTC: the run must be within one day")
	}
	for _, p := range []bucket.Policy{{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Hour, Burst: 10000}, quota} {
		t.Run(p.Algorithm.String(), func(t *testing.T) { testChargesOnce(t, p) })
	}
}

func testChargesOnce(t *testing.T, p bucket.Policy) {
	store, err := redisstore.Open(redisstore.Options{Addresses: []string{redistest.StandaloneAddr(t)},
		KeyPrefix: fmt.Sprintf("once%d:", time.Now().UnixNano()), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	peer := &lossyPeer{Store: store}
	const interval = 20 * time.Millisecond
	x := regions.New(regions.Config{This: "eu", Home: store, Peers: map[string]regions.Peer{"us": peer},
		Interval: interval, Timeout: time.Second})
	x.Start()
	_, end := p.Calendar.Bounds(time.Now())
	admitted := map[string]int64{}
	for tick := range 100 {
		for k := range 30 {
			if (tick+k)%3 == 0 {
				key := fmt.Sprint("client", k)
				r := bucket.Request{Zone: "api", Key: key, Policy: p, Cost: 1, Global: true}
				if p.Algorithm == bucket.Quota {
					x.RecordPeriod(&r, end)
				} else {
					x.Record(&r)
				}
				admitted[key]++
			}
		}
		time.Sleep(interval / 4)
	}
	time.Sleep(3 * interval) // the last counts handed out, some exchanges in doubt
	peer.mu.Lock()
	peer.clean = true
	calls := peer.calls
	peer.mu.Unlock()
	x.Close() // a last, clean exchange: what is in doubt is charged again
	if calls < 10 {
		t.Fatalf("%d charges in all; want enough to lose some", calls)
	}
	share := p
	if p.Algorithm == bucket.TokenBucket {
		share.Burst = 5000 // ⌈burst / 2⌉: a region's bucket
	}
	for key, n := range admitted {
		d, err := store.Peek(context.Background(), bucket.Request{Zone: "api", Key: key, Policy: share, Global: true})
		if err != nil {
			t.Fatal(err)
		}
		if charged := share.Burst - d.Remaining; charged != n {
			t.Errorf("%s: the peer holds %d charged; want the %d admitted, exactly", key, charged, n)
		}
	}
}
