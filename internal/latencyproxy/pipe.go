package latencyproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// chunk is bytes read at once, and when to deliver them.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe carries one direction of a link: read copies what src sends into a
// queue, each chunk stamped with its read time plus the delay, and write
// delivers the queue to dst in order, each chunk at its time. The queue
// holds at most window bytes: read waits for room before reading.
type pipe struct {
	l         *link
	src, dst  net.Conn
	delivered *atomic.Int64

	mu      sync.Mutex
	cond    sync.Cond // queue changed, eof or stopped
	q       []chunk
	queued  int  // bytes in q, the chunk being written included
	eof     bool // src is done: nothing more will be queued
	stopped bool // the link is closed
}

func newPipe(l *link, src, dst net.Conn, delivered *atomic.Int64) *pipe {
	pp := &pipe{l: l, src: src, dst: dst, delivered: delivered}
	pp.cond.L = &pp.mu
	return pp
}

// read queues src's bytes until src ends or the link closes. A blackholed
// link's bytes are read and dropped.
func (pp *pipe) read() {
	defer pp.l.p.wg.Done()
	buf := make([]byte, chunkSize)
	for pp.waitRoom() {
		n, err := pp.src.Read(buf)
		if n > 0 && !pp.l.dark.Load() {
			due := time.Now().Add(time.Duration(pp.l.p.delay.Load()))
			pp.push(chunk{b: append([]byte(nil), buf[:n]...), due: due})
		}
		if err != nil {
			pp.finish()
			return
		}
	}
}

// write delivers the queue, each chunk at its time, then passes src's EOF
// on. A blackholed link's chunks are dropped when due.
func (pp *pipe) write() {
	defer pp.l.p.wg.Done()
	for {
		c, ok := pp.next()
		if !ok {
			break
		}
		if !pp.l.sleepUntil(c.due) {
			return
		}
		err := pp.deliver(c.b)
		pp.pop()
		if err != nil {
			pp.l.close()
			return
		}
	}
	pp.l.passEOF(pp.dst)
}

func (pp *pipe) deliver(b []byte) error {
	if pp.l.dark.Load() {
		return nil
	}
	// Counted first, so that a receiver that has the bytes sees them counted.
	pp.delivered.Add(int64(len(b)))
	n, err := pp.dst.Write(b)
	pp.delivered.Add(int64(n - len(b)))
	return err
}

// waitRoom waits until a whole chunk fits in the window; false once the
// link is closed.
func (pp *pipe) waitRoom() bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for !pp.stopped && pp.queued > window-chunkSize {
		pp.cond.Wait()
	}
	return !pp.stopped
}

func (pp *pipe) push(c chunk) {
	pp.mu.Lock()
	pp.q = append(pp.q, c)
	pp.queued += len(c.b)
	pp.mu.Unlock()
	pp.cond.Broadcast()
}

// next returns the first chunk, leaving it queued, waiting for one; false
// once the link is closed, or src ended and everything was delivered.
func (pp *pipe) next() (chunk, bool) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for !pp.stopped && !pp.eof && len(pp.q) == 0 {
		pp.cond.Wait()
	}
	if pp.stopped || len(pp.q) == 0 {
		return chunk{}, false
	}
	return pp.q[0], true
}

// pop removes the first chunk, making room for read.
func (pp *pipe) pop() {
	pp.mu.Lock()
	pp.queued -= len(pp.q[0].b)
	pp.q[0] = chunk{}
	pp.q = pp.q[1:]
	pp.mu.Unlock()
	pp.cond.Broadcast()
}

func (pp *pipe) finish() {
	pp.mu.Lock()
	pp.eof = true
	pp.mu.Unlock()
	pp.cond.Broadcast()
}

func (pp *pipe) stop() {
	pp.mu.Lock()
	pp.stopped = true
	pp.mu.Unlock()
	pp.cond.Broadcast()
}
