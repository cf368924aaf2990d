package regions

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
)

// A link is judged by its recent failures as well as by silence: a link
// that fails now and then (resets, a lossy path) still succeeds within
// LinkTimeout, but its charges come late, and its region would count the
// peer at the whole rate. Once degradeAt of the last healthWindow
// exchanges failed, the link is degraded: reported down (Events.LinkChanged
// with an error that is ErrDegraded), this region counts itself alone
// (its share), and the sender stops marking this region in the peer, so
// that the peer soon does the same. Charges go on (in doubt until they
// run). It is up again after healthWindow exchanges in a row succeed.

// ErrDegraded is the reason given for a link reported down because too
// many of its recent exchanges failed.
var ErrDegraded = errors.New("degraded")

const (
	healthWindow = 10 // exchanges looked at
	degradeAt    = 3  // failures among them that degrade a link
)

// health is the record of a link's last exchanges.
type health struct {
	last     uint32 // bit i: the exchange i before the latest failed
	degraded bool
}

// add records an exchange, and reports whether the link's degradation
// changed.
func (h *health) add(failed bool) bool {
	h.last = h.last << 1 & (1<<healthWindow - 1)
	if failed {
		h.last |= 1
	}
	was := h.degraded
	switch n := bits.OnesCount32(h.last); {
	case n >= degradeAt:
		h.degraded = true
	case n == 0:
		h.degraded = false
	}
	return h.degraded != was
}

// err is why the link is degraded (last: the latest failure), or nil.
func (h *health) err(last error) error {
	if !h.degraded {
		return nil
	}
	msg := "none"
	if last != nil {
		msg = strings.ReplaceAll(last.Error(), "\n", "; ") // on one line
	}
	return fmt.Errorf("%w: %d of the last %d exchanges failed, the latest: %s", ErrDegraded, bits.OnesCount32(h.last), healthWindow, msg)
}
