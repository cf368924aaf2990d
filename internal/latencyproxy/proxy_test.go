package latencyproxy

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestStartChecksItsArguments(t *testing.T) {
	for _, target := range []string{"10.0.0.1:6379", "example.com:6379", "127.0.0.1"} {
		if p, err := Start(target, 0); err == nil {
			p.Close()
			t.Errorf("Start(%q) accepted a target off loopback or without a port", target)
		}
	}
	if p, err := Start("127.0.0.1:6379", -time.Second); err == nil {
		p.Close()
		t.Error("Start accepted a negative delay")
	}
}

func TestRoundTripCostsTwoDelays(t *testing.T) {
	const delay = 80 * time.Millisecond
	p := startProxy(t, startServer(t, echo).addr(), delay)
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr %q, want 127.0.0.1:port", p.Addr())
	}
	c := dial(t, p.Addr())
	for i := range 3 {
		rtt := roundTrip(t, c, "hello")
		t.Logf("round trip %d at delay %v: %v", i, delay, rtt)
		if rtt < 2*delay || rtt >= slack {
			t.Fatalf("round trip %v, want at least %v and under %v", rtt, 2*delay, slack)
		}
	}
	p.SetDelay(150 * time.Millisecond)
	if rtt := roundTrip(t, c, "again"); rtt < 300*time.Millisecond || rtt >= slack {
		t.Fatalf("round trip %v after SetDelay(150ms), want at least 300ms and under %v", rtt, slack)
	}
	if up, down := p.Bytes(); up != 20 || down != 20 {
		t.Fatalf("Bytes() = %d, %d; want 20, 20", up, down)
	}
	if n := p.Conns(); n != 1 {
		t.Fatalf("Conns() = %d, want 1", n)
	}
}

// TestLargeTransferKeepsOrderAndPipelines echoes 8 MiB: the bytes come back
// in order, and far sooner than a chunk per delay would allow.
func TestLargeTransferKeepsOrderAndPipelines(t *testing.T) {
	const delay = 50 * time.Millisecond
	data := make([]byte, 8<<20)
	rand.NewChaCha8([32]byte{1}).Read(data)
	p := startProxy(t, startServer(t, echo).addr(), delay)
	c := dial(t, p.Addr())
	c.SetDeadline(time.Now().Add(30 * time.Second))

	start := time.Now()
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if len(got) != len(data) || sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatalf("echoed %d bytes, sha256 %x; sent %d, sha256 %x",
			len(got), sha256.Sum256(got), len(data), sha256.Sum256(data))
	}
	serial := time.Duration(len(data)/chunkSize) * delay
	t.Logf("8 MiB echoed at delay %v in %v (a chunk per delay would take %v)", delay, elapsed, serial)
	if elapsed < 2*delay || elapsed >= serial/2 {
		t.Fatalf("transfer took %v, want at least %v and under %v", elapsed, 2*delay, serial/2)
	}
	if up, down := p.Bytes(); up != int64(len(data)) || down != int64(len(data)) {
		t.Fatalf("Bytes() = %d, %d; want %d both ways", up, down, len(data))
	}
}

// TestSlowTargetBacksUp writes to a target that never reads: the proxy
// holds at most its window, and the client's writes block.
func TestSlowTargetBacksUp(t *testing.T) {
	p := startProxy(t, startServer(t, hold).addr(), 10*time.Millisecond)
	c := dial(t, p.Addr())
	buf := make([]byte, 1<<20)
	const limit = 256 << 20
	written := 0
	for written < limit {
		c.SetWriteDeadline(time.Now().Add(time.Second))
		n, err := c.Write(buf)
		written += n
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if written >= limit {
		t.Fatalf("wrote %d MiB into a target that never reads: no back-pressure", written>>20)
	}
	l := only(t, p)
	l.mu.Lock()
	pipes := l.pipes
	l.mu.Unlock()
	for i, pp := range pipes {
		if q := pp.queuedBytes(); q > window {
			t.Errorf("pipe %d holds %d bytes, over the %d-byte window", i, q, window)
		}
	}
	t.Logf("writes blocked after %.1f MiB (kernel buffers and the window); up pipe holds %d bytes",
		float64(written)/(1<<20), pipes[0].queuedBytes())
}

func TestCutBlackholesAndHealReconnects(t *testing.T) {
	p := startProxy(t, startServer(t, echo).addr(), 10*time.Millisecond)
	before := dial(t, p.Addr())
	roundTrip(t, before, "up")

	p.Cut()
	up, down := p.Bytes()
	expectSilence(t, before, "lost")
	during := dial(t, p.Addr()) // accepted, but blackholed
	expectSilence(t, during, "lost too")
	eventually(t, "both connections stay open while cut", func() bool { return p.Conns() == 2 })
	if u, d := p.Bytes(); u != up || d != down {
		t.Fatalf("Bytes() went from %d, %d to %d, %d while cut", up, down, u, d)
	}

	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, before)
	expectClosed(t, during)
	after := dial(t, p.Addr())
	if rtt := roundTrip(t, after, "healed"); rtt >= slack {
		t.Fatalf("round trip after Heal took %v", rtt)
	}
	eventually(t, "the blackholed connections are forgotten", func() bool { return p.Conns() == 1 })
}

func TestRefuseRefusesAndHealReopens(t *testing.T) {
	p := startProxy(t, startServer(t, echo).addr(), 10*time.Millisecond)
	c := dial(t, p.Addr())
	roundTrip(t, c, "up")

	p.Refuse()
	expectClosed(t, c)
	if _, err := net.DialTimeout("tcp", p.Addr(), slack); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while refusing: %v, want connection refused", err)
	}
	if n := p.Conns(); n != 0 {
		t.Fatalf("Conns() = %d while refusing, want 0", n)
	}
	p.Cut() // no effect while refusing

	if err := p.Heal(); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, dial(t, p.Addr()), "back")
}

func TestTargetDownClosesClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close()
	p := startProxy(t, target, 0)
	expectClosed(t, dial(t, p.Addr()))
	eventually(t, "the connection is forgotten", func() bool { return p.Conns() == 0 })
}

// TestCloseLeavesNoGoroutines closes a proxy with links in every state: up,
// backed up by a client that does not read, blackholed.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	srv := startServer(t, echo)
	p, err := Start(srv.addr(), 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	idle := dial(t, p.Addr())
	roundTrip(t, idle, "up")
	busy := dial(t, p.Addr())
	werr := make(chan error, 1)
	go func() { // echoed back but never read: blocks until Close
		_, err := busy.Write(make([]byte, 64<<20))
		werr <- err
	}()
	eventually(t, "the busy client is backed up", func() bool { return fullPipe(p) })
	p.Cut()
	dark := dial(t, p.Addr())
	eventually(t, "the blackholed connection is accepted", func() bool { return p.Conns() == 3 })

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Heal(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Heal after Close: %v, want net.ErrClosed", err)
	}
	<-werr // ended by Close
	for _, c := range []net.Conn{idle, busy, dark} {
		expectClosed(t, c)
		c.Close()
	}
	srv.stop()
	var n int
	for end := time.Now().Add(pollTimeout); ; time.Sleep(10 * time.Millisecond) {
		if n = runtime.NumGoroutine(); n <= base {
			return
		}
		if time.Now().After(end) {
			break
		}
	}
	var stacks bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&stacks, 1)
	t.Fatalf("%d goroutines after Close, %d before:\n%s", n, base, stacks.String())
}

// TestResetResetsAndKeepsListening: Reset ends an open connection with a
// reset (not a clean end of stream), and a new connection goes through.
func TestResetResetsAndKeepsListening(t *testing.T) {
	p := startProxy(t, startServer(t, echo).addr(), 10*time.Millisecond)
	c := dial(t, p.Addr())
	roundTrip(t, c, "up")
	p.Reset()
	c.SetReadDeadline(time.Now().Add(slack))
	if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after Reset: %v, want connection reset", err)
	}
	roundTrip(t, dial(t, p.Addr()), "back")
}

// TestFlapFailsPartOfEveryPeriod: over a second of Flap(40ms, 100ms) (ten
// failures), round trips on new connections fail in most failures and
// succeed between them; stop leaves the link up.
func TestFlapFailsPartOfEveryPeriod(t *testing.T) {
	p := startProxy(t, startServer(t, echo).addr(), 0)
	stop := p.Flap(40*time.Millisecond, 100*time.Millisecond)
	ok, failed := 0, 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if echoed(p.Addr(), 20*time.Millisecond) {
			ok++
		} else {
			failed++
		}
	}
	stop()
	t.Logf("round trips during Flap: %d ok, %d failed", ok, failed)
	if failed < 5 || ok < 30 {
		t.Errorf("%d round trips failed and %d succeeded during Flap(40ms, 100ms); want at least 5 and 30", failed, ok)
	}
	roundTrip(t, dial(t, p.Addr()), "after")
}

// echoed reports whether a new connection to addr echoes a byte within d.
func echoed(addr string, d time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	buf := []byte{'x'}
	if _, err := c.Write(buf); err != nil {
		return false
	}
	_, err = io.ReadFull(c, buf)
	return err == nil
}
