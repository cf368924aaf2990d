package regions_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/regions"
)

// floodEvents counts what an exchange charged and dropped.
type floodEvents struct {
	mu               sync.Mutex
	charged, dropped int
	exchanges, fails int
	floods           []bool
	x                *regions.Exchange
	counted          []int // regions counted as a flood was reported, when not 1
}

func (e *floodEvents) LinkChanged(string, bool, error) {}
func (e *floodEvents) Heard(string, bool)              {}
func (e *floodEvents) ConfigDiffers(string, string)    {}
func (e *floodEvents) Exchanged(_ string, keys int, _ time.Duration, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.charged += keys
	e.exchanges++
	if err != nil {
		e.fails++
	}
}
func (e *floodEvents) Dropped(_ string, n int) { e.mu.Lock(); e.dropped += n; e.mu.Unlock() }
func (e *floodEvents) Flooding(on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.floods = append(e.floods, on)
	if _, counted := e.x.Links(); on && counted != 1 {
		e.counted = append(e.counted, counted)
	}
}

// TestExchangeFlood: a million distinct keys admitted in one interval.
// The instance floods: it decides with its share (counted alone) and
// reports it once; the exchanges tell the peer what they can, paced, so
// that the peer's Redis never holds its other clients beyond a quarter
// of their 100 ms timeout (the peer's slow log; a probe's pings logged);
// every admission is either charged to the peer or counted dropped; and
// once the flood is over, the instance counts the peer again.
func TestExchangeFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a million keys")
	}
	home, peerServer := redistest.NewServer(t), redistest.NewServer(t)
	homeStore, peerStore := openStore(t, home.Addr), openStore(t, peerServer.Addr)
	probe := redis.NewClient(&redis.Options{Addr: peerServer.Addr})
	defer probe.Close()
	probe.ConfigSet(context.Background(), "slowlog-log-slower-than", "5000")
	probe.SlowLogReset(context.Background())
	const interval = 100 * time.Millisecond
	ev := &floodEvents{}
	x := regions.New(regions.Config{This: "eu", Home: homeStore, Peers: map[string]regions.Peer{"us": peerStore},
		Interval: interval, Timeout: time.Second})
	ev.x = x
	x.OnEvents(ev)
	x.Start()
	defer x.Close()
	homeStore.MarkRegion(context.Background(), "us", regions.Fingerprint{}.Mark(), time.Hour) // us is heard
	waitCounted(t, x, 2)

	stop := pingPeer(probe)
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Minute, Burst: 10}
	const keys = 1 << 20
	for i := range keys {
		x.Record(&bucket.Request{Zone: "api", Key: fmt.Sprint("k", i), Policy: p, Cost: 1, Global: true})
	}
	ev.waitTold(keys)
	waitCounted(t, x, 2) // the flood ends LinkTimeout after the last count dropped
	lat := stop()
	slow := probe.SlowLogGet(context.Background(), 100).Val()
	checkSlowLog(t, slow)
	ev.mu.Lock()
	defer ev.mu.Unlock()
	slices.Sort(lat)
	slowest := time.Duration(0)
	for _, s := range slow {
		slowest = max(slowest, s.Duration)
	}
	t.Logf("the peer's slowest command: %s", slowest)
	t.Logf("%d keys: charged %d, dropped %d, in %d exchanges (%d failed); floods %v; peer pings %d, p99 %s, max %s; slow log %d entries over 5 ms",
		keys, ev.charged, ev.dropped, ev.exchanges, ev.fails, ev.floods, len(lat), lat[len(lat)*99/100], lat[len(lat)-1], len(slow))
	if ev.charged+ev.dropped != keys {
		t.Errorf("%d charged and %d dropped of %d admitted; want every one, one or the other", ev.charged, ev.dropped, keys)
	}
	if len(ev.floods) == 0 || len(ev.floods)%2 != 0 || slices.Compact(slices.Clone(ev.floods))[0] != true || len(slices.Compact(slices.Clone(ev.floods))) != len(ev.floods) {
		t.Errorf("floods reported %v; want starts and ends in turn, the last an end", ev.floods)
	}
	if len(ev.counted) > 0 {
		t.Errorf("regions counted as floods were reported: %v; want this one alone", ev.counted)
	}
	if ev.charged < 10000 {
		t.Errorf("%d charged; want the exchanges to tell the peer what they can", ev.charged)
	}

	// The probe's own times add this process's scheduling on a loaded
	// host (the race detector, other packages' tests): logged, not held.
}

// waitCounted waits until x counts n regions.
func waitCounted(t *testing.T, x *regions.Exchange, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, counted := x.Links(); counted == n {
			return
		}
		if time.Now().After(deadline) {
			_, counted := x.Links()
			t.Fatalf("%d regions counted after 30 s; want %d", counted, n)
		}
	}
}

// pingPeer pings c every 2 ms until stop, which returns each ping's time.
func pingPeer(c *redis.Client) (stop func() []time.Duration) {
	done := make(chan struct{})
	var lat []time.Duration
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			start := time.Now()
			c.Ping(context.Background())
			lat = append(lat, time.Since(start))
		}
	}()
	return func() []time.Duration { close(done); wg.Wait(); return lat }
}

// waitTold waits, at most a minute, until n admissions are charged or
// dropped: what the instance kept is told by the exchanges that follow
// the flood, at their pace.
func (e *floodEvents) waitTold(n int) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		e.mu.Lock()
		told := e.charged + e.dropped
		e.mu.Unlock()
		if told >= n {
			return
		}
	}
}

// checkSlowLog checks the peer's slow log: a call of 128 buckets takes
// about 1.5 ms, and on a loaded host the peer's Redis may be preempted
// during one: at most one call past a quarter of its clients' 100 ms
// timeout, none past the timeout.
func checkSlowLog(t *testing.T, slow []redis.SlowLog) {
	t.Helper()
	over := 0
	for _, s := range slow {
		if s.Duration > 25*time.Millisecond {
			over++
		}
		if s.Duration > 100*time.Millisecond || over > 1 {
			t.Errorf("the peer's Redis ran %v for %s (%d calls over 25 ms); want at most one over 25 ms, a quarter of its clients' timeout, and none over 100 ms",
				s.Args[:min(len(s.Args), 2)], s.Duration, over)
		}
	}
}

// openStore opens a store of the Redis at addr, closed when t ends.
func openStore(t *testing.T, addr string) *redisstore.Store {
	t.Helper()
	s, err := redisstore.Open(redisstore.Options{Addresses: []string{addr}, KeyPrefix: "flood:", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
