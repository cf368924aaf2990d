package latencyproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	chunkSize   = 32 << 10        // bytes read at once
	window      = 1 << 20         // bytes in flight per direction, at most
	dialTimeout = 5 * time.Second // connecting to the target
	acceptPause = 10 * time.Millisecond
)

type state int

const (
	stateUp state = iota
	stateCut
	stateRefused
)

// Proxy is a delayed link from a loopback address (Addr) to a target.
// Its methods are safe for concurrent use.
type Proxy struct {
	target string
	addr   string
	delay  atomic.Int64 // nanoseconds
	up     atomic.Int64 // bytes delivered to the target
	down   atomic.Int64 // bytes delivered to clients

	ctx    context.Context // cancelled by Close: ends dials in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine of the proxy

	mu     sync.Mutex
	ln     net.Listener // nil while refusing and after Close
	state  state
	closed bool
	links  map[*link]struct{}
}

// Start listens on a free port of 127.0.0.1 and forwards every connection
// it accepts to target, a host:port on loopback, delay later in each
// direction.
func Start(target string, delay time.Duration) (*Proxy, error) {
	if delay < 0 {
		return nil, fmt.Errorf("latencyproxy: negative delay %v", delay)
	}
	if err := checkLoopback(target); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{target: target, addr: ln.Addr().String(), ctx: ctx, cancel: cancel,
		ln: ln, links: map[*link]struct{}{}}
	p.delay.Store(int64(delay))
	p.wg.Add(1)
	go p.accept(ln)
	return p, nil
}

func checkLoopback(target string) error {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return fmt.Errorf("latencyproxy: target %q: %w", target, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("latencyproxy: target %q is not on loopback", target)
	}
	return nil
}

// Addr is the address clients connect to: 127.0.0.1 and a port, the same
// for the proxy's whole life.
func (p *Proxy) Addr() string { return p.addr }

// SetDelay sets the delay of the bytes read from now on, in both
// directions. A negative delay counts as zero.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(max(d, 0))) }

// Conns is the number of open client connections, blackholed ones included.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Bytes returns the bytes delivered so far (handed to the receiving
// connection): up to the target, down to the clients. Bytes dropped by a
// cut do not count.
func (p *Proxy) Bytes() (up, down int64) { return p.up.Load(), p.down.Load() }

// Cut partitions the link: open connections and new ones are blackholed
// until Heal (see the package doc). It does nothing while the proxy
// refuses connections or after Close.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.state != stateUp {
		return
	}
	p.state = stateCut
	for l := range p.links {
		l.blackhole()
	}
}

// Refuse makes the peer dead: it closes every connection and the listening
// port, so new connections are refused, until Heal. It does nothing after
// Close.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	if p.closed || p.state == stateRefused {
		p.mu.Unlock()
		return
	}
	p.state = stateRefused
	_ = p.ln.Close()
	p.ln = nil
	links := p.takeLinks()
	p.mu.Unlock()
	closeAll(links)
}

// Heal brings the link up. After Cut it closes the connections that were
// blackholed; after Refuse it listens on Addr again, and fails if that port
// was taken meanwhile. After Close it returns net.ErrClosed.
func (p *Proxy) Heal() error {
	p.mu.Lock()
	var links []*link
	switch {
	case p.closed:
		p.mu.Unlock()
		return net.ErrClosed
	case p.state == stateCut:
		links = p.takeLinks() // all of them are blackholed
	case p.state == stateRefused:
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			p.mu.Unlock()
			return fmt.Errorf("latencyproxy: listening again on %s: %w", p.addr, err)
		}
		p.ln = ln
		p.wg.Add(1)
		go p.accept(ln)
	}
	p.state = stateUp
	p.mu.Unlock()
	closeAll(links)
	return nil
}

// Close stops the listener and every connection, and returns once every
// goroutine of the proxy has ended.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var err error
	if p.ln != nil {
		err = p.ln.Close()
		p.ln = nil
	}
	links := p.takeLinks()
	p.mu.Unlock()
	p.cancel()
	closeAll(links)
	p.wg.Wait()
	return err
}

// accept serves one listener until it is closed (by Refuse or Close).
func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // out of file descriptors, say: try again shortly
			time.Sleep(acceptPause)
			continue
		}
		p.admit(c)
	}
}

// admit starts a link for a new client connection, blackholed while cut.
func (p *Proxy) admit(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.state == stateRefused {
		_ = c.Close()
		return
	}
	l := newLink(p, c)
	if p.state == stateCut {
		l.blackhole()
	}
	p.links[l] = struct{}{}
	p.wg.Add(1)
	go l.run()
}

// takeLinks empties the set of links and returns them; p.mu is held.
func (p *Proxy) takeLinks() []*link {
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	clear(p.links)
	return links
}

func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

func closeAll(links []*link) {
	for _, l := range links {
		l.close()
	}
}

// Reset resets every open connection at both ends (a TCP RST: the bytes in
// flight are lost) and keeps listening: clients see "connection reset"
// on their next read or write, and reconnect.
func (p *Proxy) Reset() {
	p.mu.Lock()
	links := p.takeLinks()
	p.mu.Unlock()
	for _, l := range links {
		l.reset()
	}
}

// Flap makes the link fail for down of every period, from now until the
// returned stop is called: it is cut (every byte sent meanwhile lost, the
// requests in flight time out) for down, then healed (the connections cut
// are closed, new ones go through). stop waits for the schedule to end
// and leaves the link up.
func (p *Proxy) Flap(down, period time.Duration) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			p.Cut()
			select {
			case <-done:
			case <-time.After(down):
			}
			_ = p.Heal()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		<-ended
	}
}
