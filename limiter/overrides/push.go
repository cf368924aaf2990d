package overrides

// The changes pushed (announced on the channel), queued until the next
// read, and read together when they follow on from the snapshot in force.

import "context"

// pushed queues a change announced, and wakes the loop.
func (o *Overrides) pushed(d delta) {
	o.pendMu.Lock()
	if !o.full {
		if len(o.pending) >= maxPending || o.pendNames+len(d.names) > maxPushedNames {
			o.pending, o.pendNames, o.full = nil, 0, true
		} else {
			o.pending, o.pendNames = append(o.pending, d), o.pendNames+len(d.names)
		}
	}
	o.pendMu.Unlock()
	o.wake("push")
}

// takePending takes the changes pushed, and whether some were dropped.
func (o *Overrides) takePending() ([]delta, bool) {
	o.pendMu.Lock()
	defer o.pendMu.Unlock()
	p, full := o.pending, o.full
	o.pending, o.pendNames, o.full = nil, 0, false
	return p, full
}

// readPushed applies the changes pushed to cur when they follow on from
// it (those already applied skipped), reading their entries; false when
// there are none, or when they do not follow on (a whole read is due).
func (o *Overrides) readPushed(ctx context.Context, cur *Set) (*Set, bool, error) {
	pending, full := o.takePending()
	if full || len(pending) == 0 || cur == nil {
		return nil, false, nil
	}
	token, names := cur.token, []string(nil)
	for _, d := range pending {
		switch {
		case d.prev == token:
			token, names = d.next, append(names, d.names...)
		case o.wasApplied(d.next):
		default:
			return nil, false, nil
		}
	}
	if token == cur.token {
		return cur, true, nil
	}
	if len(names) > maxPushedNames {
		return nil, false, nil
	}
	changes, err := o.src.entries(ctx, names, o.skipped)
	if err != nil {
		return nil, false, err
	}
	if s := cur.apply(changes, token); s.size() <= MaxEntries {
		return s, true, nil
	}
	return nil, false, nil // past the bound: a whole read leaves out the rest
}

func (o *Overrides) wasApplied(token string) bool {
	for _, t := range o.applied {
		if t == token {
			return true
		}
	}
	return false
}
