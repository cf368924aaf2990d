package overrides

// The order of the changes of one entry: a stamp of a hybrid logical
// clock and the origin of the change (see the package doc, Order).

import (
	"cmp"
	"errors"
	"strings"
	"sync"
	"time"
)

// TombstoneTTL is how long the deletion of an override without an expiry
// is kept: a copy of the override older than that (a region or an
// instance cut off for longer) can bring it back.
const TombstoneTTL = 7 * 24 * time.Hour

// maxStampN bounds a stamp's logical counter, and maxOrigin its origin
// (an instance's 16 hex digits): both stay exact in Lua's doubles and
// comparable as strings.
const (
	maxStampN = 1 << 52
	maxOrigin = 32
)

// Stamp is when a change was made, on a hybrid logical clock: MS, Unix
// milliseconds of the clock of the instance that made it, or beyond (a
// later stamp it had read), and N, a counter within one millisecond;
// Origin is that instance's random id. Changes are ordered by (MS, N,
// Origin); the zero Stamp (an entry written by an earlier version) comes
// first.
type Stamp struct {
	MS     int64  `json:"ms"`
	N      int64  `json:"n"`
	Origin string `json:"origin,omitempty"`
}

// Compare orders s and t: -1, 0 or +1.
func (s Stamp) Compare(t Stamp) int {
	return cmp.Or(cmp.Compare(s.MS, t.MS), cmp.Compare(s.N, t.N), strings.Compare(s.Origin, t.Origin))
}

// IsZero reports whether s is the zero Stamp.
func (s Stamp) IsZero() bool { return s == Stamp{} }

// check reports what is wrong with s's shape.
func (s Stamp) check() error {
	if s.MS < 0 || s.MS > maxOverrideMillis || s.N < 0 || s.N > maxStampN || len(s.Origin) > maxOrigin {
		return errors.New("stamp: want ms before the year 2200, n from 0 to 2^52, an origin of at most 32 hex digits")
	}
	for _, c := range []byte(s.Origin) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return errors.New("stamp: want an origin of lowercase hex digits")
		}
	}
	return nil
}

// hlc is an instance's hybrid logical clock: the latest stamp it made or
// read. A change made after reading a stamp is stamped after it, whatever
// the instance's clock says.
type hlc struct {
	mu     sync.Mutex
	last   Stamp // MS and N
	origin string
}

// next is the stamp of a change made at now.
func (h *hlc) next(now time.Time) Stamp {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ms := now.UnixMilli(); ms > h.last.MS {
		h.last = Stamp{MS: ms}
	} else {
		h.last.N++
	}
	return Stamp{MS: h.last.MS, N: h.last.N, Origin: h.origin}
}

// observe moves the clock to s when s is later (the stamps read).
func (h *hlc) observe(s Stamp) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.MS > h.last.MS || s.MS == h.last.MS && s.N > h.last.N {
		h.last = Stamp{MS: s.MS, N: s.N}
	}
}

// tombstone is the deletion, at stamp, of of (held: it existed here): kept
// until of would have expired, or TombstoneTTL after now without an
// expiry.
func tombstone(stamp Stamp, of Override, held bool, now time.Time) Override {
	t := Override{Deleted: true, Stamp: stamp, Set: now.UnixMilli(), Expires: now.Add(TombstoneTTL).UnixMilli()}
	if held && of.Expires > 0 {
		t.Expires = of.Expires
	}
	return t
}
