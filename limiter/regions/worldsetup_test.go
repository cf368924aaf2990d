package regions_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/latencyproxy"
	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// A test world: three regions on loopback, each deciding from its own
// Redis (two standalone servers and a 3-master Cluster), each reaching the
// others' Redis through proxies that add delay each way, one proxy per
// link (from, to and node), so that a link or a region can be cut.

// region is one region of a test world.
type region struct {
	name    string
	l       *limiter.Limiter
	ev      *linkEvents
	addrs   []string // its Redis's nodes
	cluster bool
	server  *redistest.Server // its Redis, but a cluster's
	config  limiter.Config    // l's: another instance of the region is made of it
}

// world is the regions and the proxies of their links: proxies[from][to]
// by the node of to they lead to.
type world struct {
	regions []*region
	proxies map[string]map[string]map[string]*latencyproxy.Proxy
	keyIn   map[string]string // by region: what its client keys start with (a key_secret of its own)
	rateIn  map[string]int64  // by region: its zone's rate, when it is not the policy's
	prefix  string            // of every region's keys
}

// linkEvents records what an exchange tells.
type linkEvents struct {
	mu        sync.Mutex
	changes   []string
	failures  []string          // each peer's first failed exchange
	heard     []string          // the marks missing, then back
	differs   []string          // the fingerprints that differ, then agree
	floods    []bool            // floods' starts and ends
	exchanges map[string][2]int // by peer: ok, failed
}

func (e *linkEvents) LinkChanged(peer string, up bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.changes = append(e.changes, fmt.Sprintf("%s up=%v", peer, up))
}

func (e *linkEvents) Exchanged(peer string, _ int, _ time.Duration, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.exchanges[peer]
	if err != nil {
		if n[1] == 0 {
			e.failures = append(e.failures, fmt.Sprintf("%s: %v", peer, err))
		}
		n[1]++
	} else {
		n[0]++
	}
	e.exchanges[peer] = n
}

func (e *linkEvents) Dropped(string, int) {}

func (e *linkEvents) Flooding(on bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.floods = append(e.floods, on)
}

func (e *linkEvents) ConfigDiffers(peer, diff string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.differs = append(e.differs, fmt.Sprintf("%s: %q", peer, diff))
}

func (e *linkEvents) Heard(peer string, heard bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.heard = append(e.heard, fmt.Sprintf("%s heard=%v", peer, heard))
}

// newWorld starts three regions whose links delay each way by delay; the
// exchanges run every interval, each within a second.
func newWorld(t *testing.T, delay, interval time.Duration) *world {
	return newWorldTimeout(t, delay, interval, time.Second)
}

// newWorldTimeout is newWorld with exchanges within timeout.
func newWorldTimeout(t *testing.T, delay, interval, timeout time.Duration) *world {
	t.Helper()
	prefix := fmt.Sprintf("regions%x:", rand.Uint64())
	cl := redistest.NewClusterOf(t, 3, 0)
	w := &world{proxies: map[string]map[string]map[string]*latencyproxy.Proxy{}, prefix: prefix}
	w.regions = []*region{
		{name: "eu", server: redistest.NewServer(t)},
		{name: "us", server: redistest.NewServer(t)},
		{name: "ap", addrs: cl.Addrs(), cluster: true},
	}
	for _, r := range w.regions[:2] {
		r.addrs = []string{r.server.Addr}
	}
	for _, r := range w.regions {
		peers := map[string]limiter.RedisOptions{}
		for _, o := range w.regions {
			if o != r {
				peers[o.name] = w.peerOptions(t, r, o, prefix, delay, timeout)
			}
		}
		r.ev = &linkEvents{exchanges: map[string][2]int{}}
		r.config = limiter.Config{Redis: &limiter.RedisOptions{Addresses: r.addrs, Cluster: r.cluster, KeyPrefix: prefix, Timeout: time.Second},
			Regions: &limiter.Regions{This: r.name, Peers: peers, Interval: interval}, RegionEvents: r.ev}
		r.l = r.instance(t)
	}
	return w
}

// instance starts an instance of r, through r's proxies to the others;
// it is closed when t ends.
func (r *region) instance(t *testing.T) *limiter.Limiter {
	t.Helper()
	l, err := limiter.New(r.config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// client is a client of r's Redis.
func (r *region) client() redis.UniversalClient {
	if r.cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: r.addrs, MaxRedirects: -1})
	}
	return redis.NewClient(&redis.Options{Addr: r.addrs[0], MaxRetries: -1})
}

// peerOptions are from's options of to's Redis, through proxies of delay.
func (w *world) peerOptions(t *testing.T, from, to *region, prefix string, delay, timeout time.Duration) limiter.RedisOptions {
	t.Helper()
	byNode := map[string]*latencyproxy.Proxy{}
	for _, a := range to.addrs {
		p, err := latencyproxy.Start(a, delay)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		byNode[a] = p
	}
	if w.proxies[from.name] == nil {
		w.proxies[from.name] = map[string]map[string]*latencyproxy.Proxy{}
	}
	w.proxies[from.name][to.name] = byNode
	var d net.Dialer
	return limiter.RedisOptions{Addresses: to.addrs, Cluster: to.cluster, KeyPrefix: prefix, Timeout: timeout,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if p := byNode[addr]; p != nil {
				addr = p.Addr()
			}
			return d.DialContext(ctx, network, addr)
		}}
}

// cutLink cuts (or heals) the links between regions a and b, both ways.
func (w *world) cutLink(t *testing.T, a, b string, cut bool) {
	t.Helper()
	for _, ends := range [][2]string{{a, b}, {b, a}} {
		for _, p := range w.proxies[ends[0]][ends[1]] {
			if cut {
				p.Cut()
			} else if err := p.Heal(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// cut cuts (or heals) every link into and out of region name.
func (w *world) cut(t *testing.T, name string, cut bool) {
	t.Helper()
	for from, tos := range w.proxies {
		for to, byNode := range tos {
			if from != name && to != name {
				continue
			}
			for _, p := range byNode {
				if cut {
					p.Cut()
				} else if err := p.Heal(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// quietEvents are the Events of the limiters of a world: none is looked
// at.
type quietEvents struct{}

func (quietEvents) StoreFailing(error)               {}
func (quietEvents) StoreRecovered(string)            {}
func (quietEvents) ScriptFailed(error, bool)         {}
func (quietEvents) BanStarted(string, time.Duration) {}
func (quietEvents) Debug(string, error)              {}
