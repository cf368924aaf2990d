package fleetsync

// The storage fleet's calls of its storage (see storage.go): each
// within a timeout, even when the storage does not honour its context,
// and their failures told to StorageEvents once each.

import (
	"context"
	"fmt"
	"time"
)

// StorageEvents are told of the storage's failures, and of files skipped.
// Their methods must not block.
type StorageEvents interface {
	// StorageFailing: the storage failed (a read or a write); called once
	// until StorageRecovered.
	StorageFailing(err error)
	// StorageRecovered: the storage answered again.
	StorageRecovered()
	// FileSkipped: another instance's file could not be used; called once
	// per file until it reads well again. Named the fleet's directory: more
	// files of instances than are counted, called once until there are
	// no more.
	FileSkipped(name string, err error)
}

// call runs op on the storage within timeout, in a goroutine of its own: a
// storage may not honour its context (a hung network mount, a FIFO where a
// file should be). While an op on key runs past its timeout, no other is
// started on that key: the call fails at once.
func (f *StorageFleet) call(key string, timeout time.Duration, op func(ctx context.Context) error) error {
	f.busyMu.Lock()
	if f.busy[key] {
		f.busyMu.Unlock()
		return fmt.Errorf("%s: an earlier call of the storage is still running, past its timeout", key)
	}
	f.busy[key] = true
	f.busyMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	done := make(chan error, 1)
	go func() {
		err := op(ctx)
		f.busyMu.Lock()
		delete(f.busy, key)
		f.busyMu.Unlock()
		done <- err
		cancel()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done: // it ended as the time was up
			return err
		default:
			return fmt.Errorf("%s: %w", key, context.DeadlineExceeded)
		}
	}
}

// The storage's operations, whose failures are told apart.
const (
	opRead = iota
	opWrite
)

// reported tells the events of a failure (err) or a recovery (nil) of op,
// once each: a recovery when neither fails any more.
func (f *StorageFleet) reported(op int, err error) {
	f.mu.Lock()
	was := f.failing[0] || f.failing[1]
	f.failing[op] = err != nil
	is := f.failing[0] || f.failing[1]
	changed := was != is
	f.mu.Unlock()
	if !changed || f.o.Events == nil {
		return
	}
	if is {
		f.o.Events.StorageFailing(err)
		return
	}
	f.o.Events.StorageRecovered()
}
