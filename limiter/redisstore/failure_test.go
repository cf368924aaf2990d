package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// cutConn passes everything through, but when armed, the connection that
// writes the next EVALSHA reads EOF instead of its reply: the script ran,
// and the connection broke before the answer came back.
type cutConn struct {
	net.Conn
	armed *atomic.Bool
	cut   bool
}

func (c *cutConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("evalsha")) && c.armed.CompareAndSwap(true, false) {
		c.cut = true
	}
	return c.Conn.Write(b)
}

func (c *cutConn) Read(b []byte) (int, error) {
	if c.cut {
		time.Sleep(50 * time.Millisecond) // the script runs meanwhile
		c.Conn.Close()
		return 0, io.EOF
	}
	return c.Conn.Read(b)
}

// TestScriptRunsOnceInCluster: go-redis's cluster client retries a command
// whose connection broke (whatever MaxRetries says); a decision that ran
// must not run again, or the client is charged twice.
func TestScriptRunsOnceInCluster(t *testing.T) {
	armed := new(atomic.Bool)
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: redistest.ClusterAddrs(t),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &cutConn{Conn: conn, armed: armed}, nil
		},
	})
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 10}
	req := []bucket.Request{{Zone: "z", Key: "once", Policy: p, Cost: 1}}
	if _, err := s.Take(t.Context(), req); err != nil { // scripts loaded, connections made
		t.Fatal(err)
	}
	armed.Store(true)
	_, cutErr := s.Take(t.Context(), req)
	if armed.Load() {
		t.Fatal("no EVALSHA went through the cut connection")
	}
	d, err := s.Peek(t.Context(), req[0])
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != 8 {
		t.Fatalf("remaining %d after two takes (one cut after it ran); want 8: the cut one ran once, not twice", d.Remaining)
	}
	if cutErr == nil || !Unavailable(cutErr) {
		t.Fatalf("the cut take: %v; want a connection error", cutErr)
	}
}

func TestUnavailable(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.DeadlineExceeded, true},
		{io.EOF, true},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{&NodeError{Node: "a:1", Err: ErrBreakerOpen}, true},
		{redis.ErrClosed, true},
		{fmt.Errorf("%w: list of 3", errReply), false},
	}
	for _, c := range cases {
		if got := Unavailable(c.err); got != c.want {
			t.Errorf("Unavailable(%v) = %v; want %v", c.err, got, c.want)
		}
	}
	// Replies of a real Redis.
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	key := fmt.Sprintf("unavailable:%d", time.Now().UnixNano())
	c.HSet(t.Context(), key, "f", "v")
	defer c.Del(context.Background(), key)
	_, wrongType := c.Get(t.Context(), key).Result()
	_, scriptErr := c.Eval(t.Context(), "return 1 + nil", nil).Result()
	for _, err := range []error{wrongType, scriptErr} {
		if err == nil || Unavailable(err) {
			t.Errorf("Unavailable(%v) = true; want false: Redis answered", err)
		}
	}
}

// TestScriptErrorKeepsBreakerClosed: a script error caused by one key's
// data (here a key of the wrong type) fails that request only; the node's
// breaker stays closed and other keys are decided.
func TestScriptErrorKeepsBreakerClosed(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 10}
	bad := bucket.Request{Zone: "z", Key: "bad", Policy: p, Cost: 1}
	if err := c.HSet(t.Context(), s.key(bad), "not", "a bucket").Err(); err != nil {
		t.Fatal(err)
	}
	for range 2 * BreakerFailures {
		if _, err := s.Take(t.Context(), []bucket.Request{bad}); err == nil || Unavailable(err) {
			t.Fatalf("take of a wrong-type key: %v; want a script error", err)
		}
	}
	if s.Breaker("").Open() {
		t.Fatal("script errors opened the breaker")
	}
	if _, err := s.Take(t.Context(), []bucket.Request{{Zone: "z", Key: "good", Policy: p, Cost: 1}}); err != nil {
		t.Fatalf("another key after script errors: %v", err)
	}
}

// TestNodeBreakers: in a cluster, a hung master opens its own breaker
// only; keys on the other masters are decided by Redis all along, and the
// hung master's keys fail fast (no timeout per call) once it is open.
func TestNodeBreakers(t *testing.T) {
	// No replicas, so that no failover moves the hung master's slots
	// during the test; the rest of the cluster serves its slots meanwhile.
	cl := redistest.NewClusterOf(t, 3, 0, "--cluster-require-full-coverage", "no")
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(),
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	s := newRedisStore(t, c)
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 1000}
	byNode := keysByNode(t, s, p)
	if len(byNode) < 2 {
		t.Fatalf("keys on %d masters; want several", len(byNode))
	}
	var hung string
	for node := range byNode {
		hung = node
		break
	}
	srv := cl.Server(hung)
	srv.Pause()
	defer srv.Resume()
	take := func(r bucket.Request) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := s.Take(ctx, []bucket.Request{r})
		return time.Since(start), err
	}
	stalls := 0
	for i := range 10 {
		for node, r := range byNode {
			took, err := take(r)
			if node != hung && err != nil && stalled(t, s, node, err, take, r) && stalls < 2 {
				stalls++
				continue
			}
			switch {
			case node != hung && err != nil:
				t.Fatalf("round %d: a key on healthy %s failed: %v", i, node, err)
			case node == hung && err == nil:
				t.Fatalf("round %d: a key on the hung master %s was decided", i, node)
			case node == hung && i >= BreakerFailures && (!errors.Is(err, ErrBreakerOpen) || took > 50*time.Millisecond):
				t.Fatalf("round %d: the hung master's key took %s (%v); want a fast ErrBreakerOpen", i, took, err)
			}
		}
	}
	for node := range byNode {
		if open := s.Breaker(node).Open(); open != (node == hung) {
			t.Errorf("breaker of %s open = %v", node, open)
		}
	}
}

// stalled tells whether err, a healthy node's key's failure, is a stall
// of the machine (a loaded one can keep a call from its reply for the
// test's 200 ms): it waited out its time, the node's breaker stayed
// closed, and the key taken again alone is decided. A hung master's
// breaker or calls that reached a healthy node's keys fail that.
func stalled(t *testing.T, s *Store, node string, err error, take func(bucket.Request) (time.Duration, error), r bucket.Request) bool {
	if !errors.Is(err, context.DeadlineExceeded) || s.Breaker(node).Open() {
		return false
	}
	_, again := take(r)
	t.Logf("a key on healthy %s waited out its time (%v); taken again: %v", node, err, again)
	return again == nil
}

// keysByNode finds a request whose key lives on each master.
func keysByNode(t *testing.T, s *Store, p bucket.Policy) map[string]bucket.Request {
	t.Helper()
	byNode := map[string]bucket.Request{}
	for i := 0; i < 200 && len(byNode) < 3; i++ {
		r := bucket.Request{Zone: "z", Key: fmt.Sprintf("node-key-%d", i), Policy: p, Cost: 1}
		nodes := s.nodes(t.Context(), s.scriptRuns([]bucket.Request{r}))
		if nodes[0] != "" {
			byNode[nodes[0]] = r
		}
	}
	return byNode
}

// TestTimeoutRaceNeverPanics: callers whose time runs out just as their
// replies land (timeouts of 0 to 20ms, 64 at once) get an answer or an
// error, never a panic.
func TestTimeoutRaceNeverPanics(t *testing.T) {
	srv := redistest.NewServer(t)
	s := newRedisStore(t, redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1}))
	s.breakers.threshold = 1 << 30 // keep calling Redis
	tb := bucket.Policy{Rate: 1000, Period: time.Second, Burst: 1000}
	fw := bucket.Policy{Algorithm: bucket.FixedWindow, Rate: 1000, Period: time.Second, Burst: 1000}
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration((g*7+i*13)%20000)*time.Microsecond)
				k := fmt.Sprint("k", (g+i)%50)
				_, _ = s.Take(ctx, []bucket.Request{{Zone: "a", Key: k, Policy: tb, Cost: 1}, {Zone: "b", Key: k, Policy: fw, Cost: 1}})
				cancel()
			}
		}()
	}
	wg.Wait()
}

// TestProbeOfAnAnsweringNodeIsRecorded: a take spanning a half-open node A
// (given the probe) and a slow node B times out; A answered, so its probe
// is recorded and A's breaker closes, instead of staying open for good.
func TestProbeOfAnAnsweringNodeIsRecorded(t *testing.T) {
	s, _ := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "")
	t0 := time.Unix(1000, 0)
	a, b := "a:1", "b:1"
	for range BreakerFailures {
		s.breakers.record([]string{a}, []error{context.DeadlineExceeded}, t0, true)
	}
	t1 := t0.Add(BreakerCooldown + time.Second)
	s.now = func() time.Time { return t1 }
	if err := s.breakers.admit([]string{a, b}, t1); err != nil {
		t.Fatal(err)
	}
	cmds := []onceCmd{{redis.NewIntSliceCmd(t.Context())}, {redis.NewIntSliceCmd(t.Context())}}
	_ = s.timedOut([]string{a, b}, cmds, []bool{true, false}, context.DeadlineExceeded, modeTake)
	if s.Breaker(a).Open() {
		t.Fatal("the node that answered its probe is still open")
	}
	if err := s.breakers.admit([]string{a}, t1.Add(time.Second)); err != nil {
		t.Fatalf("node a refused after answering: %v", err)
	}
}

// TestFailedReleasesDoNotDelayProbes: releases are sent whatever a breaker
// says; their failures do not push the cool-down back.
func TestFailedReleasesDoNotDelayProbes(t *testing.T) {
	s, _ := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "")
	t0 := time.Unix(1000, 0)
	for range BreakerFailures {
		s.breakers.record([]string{"a:1"}, []error{context.DeadlineExceeded}, t0, true)
	}
	for k := 1; k <= 10; k++ { // a failed release every second
		s.breakers.record([]string{"a:1"}, []error{context.DeadlineExceeded}, t0.Add(time.Duration(k)*time.Second), false)
	}
	if !s.Breaker("a:1").Allow(t0.Add(BreakerCooldown + time.Millisecond)) {
		t.Fatal("no probe after the cool-down: failed releases delayed it")
	}
}

// TestRefundWhileBreakerOpen: a refund gives back what a request was
// charged even while its node's breaker is open, as releases do.
func TestRefundWhileBreakerOpen(t *testing.T) {
	addr := redistest.StandaloneAddr(t)
	s := newRedisStore(t, redis.NewClient(&redis.Options{Addr: addr}))
	p := bucket.Policy{Rate: 1, Period: time.Hour, Burst: 5}
	req := []bucket.Request{{Zone: "z", Key: "refund-open", Policy: p, Cost: 2}}
	d, err := s.Take(t.Context(), req)
	if err != nil || d[0].Remaining != 3 {
		t.Fatalf("take: %+v, %v", d, err)
	}
	for range BreakerFailures {
		s.breakers.record([]string{""}, []error{context.DeadlineExceeded}, time.Now(), true)
	}
	if !s.Breaker("").Open() {
		t.Fatal("breaker not open")
	}
	if _, err := s.Refund(t.Context(), req, d); err != nil {
		t.Fatalf("refund while the breaker is open: %v", err)
	}
	other, err := New(redis.NewClient(&redis.Options{Addr: addr}), s.prefix) // its breaker closed
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if got, err := other.Peek(t.Context(), req[0]); err != nil || got.Remaining != 5 {
		t.Fatalf("after the refund: remaining %d (%v); want 5, the charge given back", got.Remaining, err)
	}
}

// TestAuthErrorsAreUnavailability: a Redis that refuses our credentials
// (none, or a wrong password) fails every decision as unavailable, which
// opens the breaker and lets on_store_error decide at once, with an error
// that names the cause; not as a malformed reply of the script.
func TestAuthErrorsAreUnavailability(t *testing.T) {
	srv := redistest.NewServer(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	if err := admin.ConfigSet(t.Context(), "requirepass", "right-password").Err(); err != nil {
		t.Fatal(err)
	}
	p := bucket.Policy{Algorithm: bucket.TokenBucket, Rate: 1, Period: time.Second, Burst: 1}
	for pw, want := range map[string]string{"": "unauthenticated", "wrong": "WRONGPASS"} {
		s, err := New(redis.NewClient(&redis.Options{Addr: srv.Addr, Password: pw, MaxRetries: -1}), "auth:")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err = s.Take(ctx, []bucket.Request{{Zone: "z", Key: "k", Policy: p, Cost: 1}})
		cancel()
		s.Close()
		if !Unavailable(err) || !AuthFailed(err) || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(want)) {
			t.Errorf("password %q: %v (unavailable %v, auth %v); want an unavailable %s error", pw, err, Unavailable(err), AuthFailed(err), want)
		}
	}
}
