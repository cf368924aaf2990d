package latencyproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// Bounds: a lower bound on latency is exact (a byte is never delivered
// early); an upper bound only tells a hang from a loaded machine.
const (
	slack       = 2 * time.Second // upper bound of a round trip
	quiet       = 300 * time.Millisecond
	ioDeadline  = 10 * time.Second
	pollTimeout = 5 * time.Second
)

// server is a TCP server on loopback that runs handle for each connection;
// stop closes it and every connection and waits for its goroutines.
type server struct {
	ln     net.Listener
	wg     sync.WaitGroup
	done   chan struct{} // closed by stop
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func startServer(t *testing.T, handle func(c net.Conn, done <-chan struct{})) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln, done: make(chan struct{})}
	s.wg.Add(1)
	go s.serve(handle)
	t.Cleanup(s.stop)
	return s
}

func (s *server) addr() string { return s.ln.Addr().String() }

func (s *server) serve(handle func(c net.Conn, done <-chan struct{})) {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns = append(s.conns, c)
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			handle(c, s.done)
		}()
	}
}

func (s *server) stop() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.done)
	s.ln.Close()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// echo sends back what it reads, then closes.
func echo(c net.Conn, _ <-chan struct{}) {
	_, _ = io.Copy(c, c)
	c.Close()
}

// hold never reads: a target too slow to take anything.
func hold(_ net.Conn, done <-chan struct{}) { <-done }

func startProxy(t *testing.T, target string, delay time.Duration) *Proxy {
	t.Helper()
	p, err := Start(target, delay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, slack)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back (from an echo server), and
// returns how long that took.
func roundTrip(t *testing.T, c net.Conn, msg string) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(ioDeadline))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading %q back: %v", msg, err)
	}
	elapsed := time.Since(start)
	if !bytes.Equal(got, []byte(msg)) {
		t.Fatalf("read %q, want %q", got, msg)
	}
	return elapsed
}

// expectSilence writes msg and checks that nothing comes back: the read
// times out (no reset, no EOF).
func expectSilence(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("writing into a cut link: %v, want the write to succeed", err)
	}
	c.SetReadDeadline(time.Now().Add(quiet))
	n, err := c.Read(make([]byte, 64))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a cut link: %d bytes, %v; want a timeout", n, err)
	}
}

// expectClosed checks that the proxy closed c: a read ends in EOF or a
// reset, not a timeout.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(slack))
	_, err := io.ReadAll(c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("connection still open, want it closed by the proxy")
	}
}

// eventually polls cond until it holds or pollTimeout passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(pollTimeout); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("after %v: %s", pollTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// only returns the proxy's single link.
func only(t *testing.T, p *Proxy) *link {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.links) != 1 {
		t.Fatalf("%d links, want 1", len(p.links))
	}
	for l := range p.links {
		return l
	}
	return nil
}

func (pp *pipe) queuedBytes() int {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.queued
}

// fullPipe tells whether one of the proxy's pipes holds a full window.
func fullPipe(p *Proxy) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.mu.Lock()
		pipes := l.pipes
		l.mu.Unlock()
		for _, pp := range pipes {
			if pp.queuedBytes() > window-chunkSize {
				return true
			}
		}
	}
	return false
}
