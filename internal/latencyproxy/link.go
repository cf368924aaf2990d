package latencyproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// link is one client connection and, unless it was blackholed on arrival,
// its connection to the target, joined by two pipes (up and down).
type link struct {
	p      *Proxy
	client net.Conn
	dark   atomic.Bool   // blackholed: read and drop, deliver nothing
	ended  atomic.Int32  // pipes that passed their EOF on
	done   chan struct{} // closed by close

	mu     sync.Mutex
	closed bool
	server net.Conn
	pipes  []*pipe // up, down; set with server
}

func newLink(p *Proxy, client net.Conn) *link {
	return &link{p: p, client: client, done: make(chan struct{})}
}

func (l *link) blackhole() { l.dark.Store(true) }

// run connects to the target and runs the pipes; a link blackholed on
// arrival never reaches the target and only drains the client.
func (l *link) run() {
	defer l.p.wg.Done()
	if l.dark.Load() {
		l.drain()
		return
	}
	d := net.Dialer{Timeout: dialTimeout}
	server, err := d.DialContext(l.p.ctx, "tcp", l.p.target)
	if err != nil {
		l.close()
		return
	}
	if !l.attach(server) {
		_ = server.Close()
		return
	}
	up, down := l.pipes[0], l.pipes[1]
	l.p.wg.Add(4)
	go up.read()
	go down.read()
	go up.write()
	go down.write()
}

// attach sets the target's connection, unless the link was closed
// meanwhile.
func (l *link) attach(server net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.server = server
	l.pipes = []*pipe{newPipe(l, l.client, server, &l.p.up), newPipe(l, server, l.client, &l.p.down)}
	return true
}

// drain reads and drops the client's bytes until it goes away or the link
// is closed.
func (l *link) drain() {
	buf := make([]byte, chunkSize)
	for {
		if _, err := l.client.Read(buf); err != nil {
			l.close()
			return
		}
	}
}

// sleepUntil waits until t, or returns false if the link is closed first.
func (l *link) sleepUntil(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-l.done:
		return false
	}
}

// passEOF half-closes dst once a pipe delivered everything before its
// source's EOF; the link closes when both directions have ended. A
// blackholed link passes nothing on: Heal or Close closes it.
func (l *link) passEOF(dst net.Conn) {
	if l.dark.Load() {
		return
	}
	select {
	case <-l.done:
		return
	default:
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	if l.ended.Add(1) == 2 {
		l.close()
	}
}

// close closes both connections, stops the pipes and forgets the link.
func (l *link) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.done)
	server, pipes := l.server, l.pipes
	l.mu.Unlock()
	_ = l.client.Close()
	if server != nil {
		_ = server.Close()
	}
	for _, pp := range pipes {
		pp.stop()
	}
	l.p.forget(l)
}

// reset closes both connections with a TCP RST (no linger), then as close.
func (l *link) reset() {
	l.mu.Lock()
	server := l.server
	l.mu.Unlock()
	for _, c := range []net.Conn{l.client, server} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
	}
	l.close()
}
