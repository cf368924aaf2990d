package overrides

// The memory store's overrides: kept in this process alone.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// memoryOverrides keeps the overrides in this process.
type memoryOverrides struct {
	mu  sync.Mutex
	set *Set
}

func (m *memoryOverrides) version(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.set.tokenOf(), nil
}

func (m *memoryOverrides) load(context.Context, func(string, string, error)) (*Set, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.set, nil
}

func (m *memoryOverrides) entries(context.Context, []string, func(string, string, error)) ([]entryChange, error) {
	return nil, errors.New("the memory store's overrides are not pushed")
}

func (m *memoryOverrides) clock(context.Context) (time.Time, error) { return time.Now(), nil }

func (m *memoryOverrides) write(_ context.Context, zone string, digest *[16]byte, o Override) (bool, delta, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	held, ok := m.set.held(zone, digest)
	found := ok && !held.Deleted
	if ok && held.Stamp.Compare(o.Stamp) >= 0 { // a later change held
		return found, delta{prev: m.set.tokenOf(), next: m.set.tokenOf()}, nil
	}
	d := delta{prev: m.set.tokenOf(), next: fmt.Sprintf("%d:", m.set.Version()+1), changes: []entryChange{{zone: zone, digest: digest, o: o}}}
	for _, e := range m.set.expired(time.Now()) { // dropped, as Redis drops them
		x := entryChange{zone: e.Zone, gone: true}
		if e.Digest != "" {
			dg, _ := ParseDigest(e.Digest)
			x.digest = &dg
		}
		d.changes = append(d.changes, x)
	}
	m.set = m.set.apply(d.changes, d.next).prune(time.Now())
	return found, d, nil
}

func (m *memoryOverrides) watch(stop <-chan struct{}, _ func(delta), _ func(string), _ Events) {
	<-stop
}
