package fleetsync

// Zones that sync through a storage (caddy-ratelimit's distributed mode
// without Redis): the fleet is the instances that write their counts to
// one storage, Caddy's (a directory, or a storage module).
//
// The model. Each instance counts what it admitted in each bucket, by
// window (storageCounts: the window's start, its count and the previous
// window's), writes all of its counts to its own file in the storage every
// WriteEvery, and reads the others' files every ReadEvery. A bucket as the
// fleet counts it is the sum of every instance's counts, each taken at
// now's window (a count of a window that has ended is the previous
// window's, then nothing). The Syncer decides on it as it does on Redis's
// bucket: each instance admits its share of what the fleet left, and
// charges its admissions to its own counts at every round. Readings cost
// no I/O (a round is a pass over memory); what the others admitted reaches
// an instance within WriteEvery + ReadEvery, which is the interval the
// bound of the Syncer counts in.
//
// An instance learns what the others admitted only at its reads, so its
// share is of what the fleet left at its last read, for the whole epoch
// until the next: a bucket shows, to the Syncer, what it held at the read
// less N times what this instance charged since (N - 1 times more than
// its own charges), so that the allowance, share of it, is the epoch's
// share less what this instance admitted since the read. Without it, an
// instance's rounds between two reads would each give it a share of what
// the others seem to leave, and it would take all of it.
//
// Only the windows (fixed, sliding counter) are counted so: per-instance
// counts of a window add up, a token bucket's state does not.
//
// Files. "<dir>/<instance>.json", written whole by its instance only (no
// two instances write one file), holding digests of client keys (never a
// key), as Redis does. The directory is untrusted input (storagefiles.go
// reads it): a reader drops a file it cannot or may not read (reported,
// its name only), deletes files not written for PurgeAge (when set), or
// else files whose counts have all faded and that were not written for
// instancesWindow. An instance counts the instances whose file was written
// within instancesWindow (three WriteEvery at least), itself included, up
// to MaxStorageInstances; one whose file is past the read's budget counts
// as having spent its share (blindShare). With a secret, every file is
// signed, and a reader uses only those signed with it, never an older one
// of an instance than it used last, and counts blind an instance whose
// file it accepted once and then cannot (storagemac.go, storagereplay.go).
//
// Failure. While the others' files cannot be read for three ReadEvery, the
// fleet's view is stale: rounds fail (nothing charged, kept to charge),
// and the Syncer admits by the local share, as with Redis.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Storage is a store of named values shared by the instances of a fleet.
// Caddy's storage (certmagic.Storage) has these methods.
type Storage interface {
	Store(ctx context.Context, key string, value []byte) error
	Load(ctx context.Context, key string) ([]byte, error)
	Delete(ctx context.Context, key string) error
	List(ctx context.Context, path string, recursive bool) ([]string, error)
}

// maxAhead is how far ahead of this instance's clock another's file may
// say it was written: more is a clock to set right, and its counts and its
// freshness are not used.
const maxAhead = 30 * time.Second

// StorageOptions configure a StorageFleet (limiter.Config.StorageOptions).
type StorageOptions struct {
	// Dir is the storage's directory of the fleet's files. Default:
	// DefaultStorageDir.
	Dir string
	// WriteEvery is how often an instance writes its counts, and
	// ReadEvery how often it reads the others'. Default: 5s each.
	WriteEvery, ReadEvery time.Duration
	// PurgeAge deletes the files of instances that did not write for so
	// long; 0: a file is deleted once its counts have all faded.
	PurgeAge time.Duration
	// Timeout is the longest a storage call waits. Default: 5s.
	Timeout time.Duration
	Events  StorageEvents
	// Secret, when set (at least 16 bytes, the same on every instance),
	// signs this instance's file and has every other file checked: one not
	// signed with it is ignored (see storagemac.go).
	Secret string
	// Read, when set, is told of every read of the others' files: the
	// buckets read, how long it took, and its error.
	Read func(buckets int, took time.Duration, err error)

	MaxEntries int // the buckets kept of all the others' files; default maxSyncEntries (tests set fewer)
}

// DefaultStorageDir is where the fleet's files are, in the storage.
const DefaultStorageDir = "rate_limit/sync"

// errStorageStale fails the rounds while the others' counts are stale, or
// this instance's (its file could not be written lately); it charged
// nothing (not MayHaveRun).
var errStorageStale error = staleError{}

// staleError is errStorageStale: a round that charged nothing
// (bucket.MayHaveRun).
type staleError struct{}

func (staleError) Error() string {
	return "the instances' counts in the storage could not be read or written lately"
}

// NotRun reports that nothing was charged.
func (staleError) NotRun() bool { return true }

// StorageFleet is the fleet of the instances that share a storage.
type StorageFleet struct {
	st      Storage
	o       StorageOptions
	id      string
	now     func() time.Time
	readMu  sync.Mutex // one read at a time
	writeMu sync.Mutex // one write at a time

	mu        sync.Mutex
	own       map[bucket.ID]*StorageCounts  // what this instance admitted
	others    map[bucket.ID][]StorageCounts // the others', as last read
	n         int64                         // instances counted at the last read
	ids       []string                      // their names, sorted, this one's included
	epoch     int                           // reads so far (see storageCounts.epochs)
	epochAt   [maxEpochs]int64              // when each epoch began (Unix ns), by epoch mod maxEpochs
	oldest    int64                         // when the oldest of the others' files last read was written (Unix ns)
	gen       atomic.Uint64                 // reads of the others' files so far
	wrote     atomic.Bool                   // this instance's file was written once
	lastWrite time.Time                     // the last write that worked
	busyMu    sync.Mutex
	busy      map[string]bool        // keys with a storage call running (see call)
	lastRead  time.Time              // the last read that worked
	failing   [2]bool                // the last read, write failed
	blind     int64                  // instances counted at the last read whose counts were not read (see blindShare)
	skipped   map[string]skipMark    // files reported skipped (the reads' own)
	surplus   bool                   // more instances than MaxStorageInstances, reported (the reads' own)
	key       []byte                 // the files' MAC key (Secret); nil: none
	signed    map[string]StorageFile // with key, the last file accepted of each instance (the reads' own; storagereplay.go)
	longest   atomic.Int64           // the longest window counted, ns (see forgotten)
	stop      chan struct{}
	done      chan struct{}
	closing   sync.Once
}

// maxEpochs bounds the epochs whose charges may be unseen by the others.
const maxEpochs = 8

// unseen is what this instance charged c's bucket since the oldest of the
// others' files it read was written: the others' admissions since then
// are not in its view, and unseen is their estimate (an instance's share
// of a fleet's traffic is alike). Counted by epoch: the current one, and
// each before it that ended after that write. The caller holds mu.
func (f *StorageFleet) unseen(c *StorageCounts) int64 {
	sum := c.epochs[f.epoch%maxEpochs]
	for k := 1; k < maxEpochs && f.epochAt[(f.epoch-k+1+maxEpochs)%maxEpochs] > f.oldest; k++ {
		sum += c.epochs[(f.epoch-k+maxEpochs)%maxEpochs]
	}
	return sum
}

// StorageFile is an instance's file.
type StorageFile struct {
	Version  int    `json:"v"`
	Instance string `json:"instance"`
	At       int64  `json:"at"`    // when written, Unix ns
	Until    int64  `json:"until"` // when its last count fades, Unix ns
	// Stopped: the instance's last write, as it stopped: its counts hold,
	// it is no instance any more.
	Stopped bool            `json:"stopped,omitempty"`
	Buckets []StorageCounts `json:"buckets"`
}

func NewStorageFleet(st Storage, o StorageOptions) *StorageFleet {
	var b [8]byte
	_, _ = rand.Read(b[:])
	o.Dir = strings.Trim(cmp.Or(o.Dir, DefaultStorageDir), "/")
	o.WriteEvery, o.ReadEvery = max(cmp.Or(o.WriteEvery, 5*time.Second), 10*time.Millisecond), max(cmp.Or(o.ReadEvery, 5*time.Second), 10*time.Millisecond)
	o.Timeout = cmp.Or(o.Timeout, 5*time.Second)
	o.MaxEntries = cmp.Or(o.MaxEntries, maxSyncEntries)
	return &StorageFleet{st: st, o: o, id: hex.EncodeToString(b[:]), now: time.Now, n: 1, key: macKey(o.Secret), signed: map[string]StorageFile{},
		own: map[bucket.ID]*StorageCounts{}, others: map[bucket.ID][]StorageCounts{}, skipped: map[string]skipMark{}, busy: map[string]bool{},
		stop: make(chan struct{}), done: make(chan struct{})}
}

// generation changes at every read of the others' files.
func (f *StorageFleet) generation() uint64 { return f.gen.Load() }

// give takes back what ChargeAll charged reqs, from the windows that hold
// now (a charge of a window that has ended is left: nothing counts it
// any more but the sliding counter's fading previous count).
func (f *StorageFleet) give(reqs []bucket.Request) {
	ns := f.now().UnixNano()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range reqs {
		c := f.own[bucket.IDOf(r)]
		if c == nil || c.Start != ns-ns%c.Period {
			continue
		}
		cost := bucket.BoundedCost(r.Cost)
		e := &c.epochs[f.epoch%maxEpochs]
		c.Curr, *e = max(c.Curr-cost, 0), max(*e-cost, 0)
	}
}

// owns reports whether this instance is r's bucket's owner, now, among
// the instances counted at the last read (by the digest and the window,
// over their sorted names): it alone decides the bucket's requests that
// cost more than a share, on the whole of what the fleet left. The owner
// moves on with each window, so that a client whose requests all reach
// one instance gets a window in N.
func (f *StorageFleet) owns(r bucket.Request) bool {
	h := r.Digest()
	turn := uint64(0)
	if p := int64(r.Policy.Period); p > 0 {
		turn = uint64(f.now().UnixNano() / p)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.ids) == 0 {
		return true
	}
	return f.ids[(binary.BigEndian.Uint64(h[:8])+turn)%uint64(len(f.ids))] == f.id
}

// Left is what r's bucket holds as the fleet counts it now: its limit
// less every instance's counts (not the epoch's share: see ChargeAll).
func (f *StorageFleet) Left(r bucket.Request) int64 {
	ns := f.now().UnixNano()
	f.mu.Lock()
	defer f.mu.Unlock()
	id := bucket.IDOf(r)
	total := f.othersWeighed(id, r.Policy, ns)
	if c := f.own[id]; c != nil {
		total += c.weighed(r.Policy.Algorithm, ns)
	}
	return int64(math.Floor(float64(r.Policy.Rate) - total + 1e-9))
}

// othersWeighed is what the others count of bucket id, of policy p, at ns:
// their counts read, and the blind instances' shares. The caller holds mu.
func (f *StorageFleet) othersWeighed(id bucket.ID, p bucket.Policy, ns int64) float64 {
	total := f.blindShare(p)
	for _, o := range f.others[id] {
		if o.Period == int64(p.Period) {
			total += o.weighed(p.Algorithm, ns)
		}
	}
	return total
}

// blindShare is what the instances counted but not read (their files past
// the read's budget) are taken to have admitted of a bucket of p: each its
// whole share, Rate/N. Not counting them in N instead would leave the
// others each a larger share and none of theirs seen, so that the fleet
// could admit up to twice the limit; taken as spent, what they admit is
// already off the others' allowance (as when every instance takes its
// share), and the bound holds. The caller holds mu.
func (f *StorageFleet) blindShare(p bucket.Policy) float64 {
	if f.blind == 0 || f.n == 0 {
		return 0
	}
	return float64(f.blind) * float64(p.Rate) / float64(f.n)
}

// groups: one group, the round is made in memory.
func (f *StorageFleet) Groups(_ context.Context, reqs []bucket.Request) [][]int {
	all := make([]int, len(reqs))
	for i := range all {
		all[i] = i
	}
	return [][]int{all}
}

// RegisterSync counts the instances whose files were fresh at the last
// read, this one included (its own file is written every WriteEvery).
func (f *StorageFleet) RegisterSync(context.Context, string, time.Duration) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n, nil
}

// CountSync is RegisterSync: an instance is counted by its file.
func (f *StorageFleet) CountSync(ctx context.Context, id string, window time.Duration) (int64, error) {
	return f.RegisterSync(ctx, id, window)
}

// Registered is the instances counted at the last read.
func (f *StorageFleet) Registered() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// stale is how long the others' counts may go unread before the rounds
// fail.
func (f *StorageFleet) stale() time.Duration { return 3 * f.o.ReadEvery }

// ChargeAll adds each request's cost to this instance's counts and tells
// its bucket as the fleet counts it: its limit less every instance's
// counts, negative past it. A request of an algorithm that does not count
// in windows gets a zero decision. Fails, charging nothing, while the
// others' counts are stale.
func (f *StorageFleet) ChargeAll(_ context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if now.Sub(f.lastRead) > f.stale() || now.Sub(f.lastWrite) > 3*f.o.WriteEvery { // the others' view of this one is stale too
		return nil, errStorageStale
	}
	d := make([]bucket.Decision, len(reqs))
	for i, r := range reqs {
		p := r.Policy
		if p.Algorithm != bucket.FixedWindow && p.Algorithm != bucket.SlidingWindowCounter || p.Period <= 0 {
			continue
		}
		id := bucket.IDOf(r)
		f.counted(p.Period)
		c := f.own[id]
		if c == nil || c.Period != int64(p.Period) {
			c = &StorageCounts{Zone: r.Zone, Algo: p.Algorithm.String(), Digest: hex.EncodeToString(id.Hash[:]), Period: int64(p.Period)}
			f.own[id] = c
		}
		ns := bucket.LateReading(now.UnixNano(), c.Period, c.Start) // c's window, when now is late for it
		c.Curr, c.Prev = c.at(ns)
		if start := ns - ns%c.Period; c.Start != start { // a new window: a new epoch for it
			c.Start, c.epochs = start, [maxEpochs]int64{}
		}
		cost := bucket.BoundedCost(r.Cost)
		e := &c.epochs[f.epoch%maxEpochs]
		c.Curr, *e = min(c.Curr+cost, bucket.MaxCost), min(*e+cost, bucket.MaxCost)
		total := c.weighed(p.Algorithm, ns) + f.othersWeighed(id, p, ns)
		reset := c.Start + c.Period
		if p.Algorithm == bucket.SlidingWindowCounter && total > 0 {
			reset += c.Period
		}
		left := int64(math.Floor(float64(p.Rate)-total+1e-9)) - (f.n-1)*f.unseen(c) // see the epochs
		d[i] = bucket.Decision{Allowed: true, Limit: p.Limit(), Remaining: max(left, -bucket.MaxCost), Reset: time.Unix(0, reset), At: now}
	}
	return d, nil
}

// Start reads the others' files and writes this instance's, within the
// timeout, then keeps doing so in the background until close.
func (f *StorageFleet) Start() {
	first := min(f.o.Timeout, 2*time.Second) // the config waits for these, each at most so long
	f.Read(first)
	f.Write(first, false)
	go f.run()
}

// run writes every WriteEvery and reads every ReadEvery, each in a
// goroutine of its own (a long read does not hold the writes), until
// close; then a last write.
func (f *StorageFleet) run() {
	defer close(f.done)
	reads := make(chan struct{})
	go func() {
		defer close(reads)
		r := time.NewTicker(f.o.ReadEvery)
		defer r.Stop()
		for {
			select {
			case <-f.stop:
				return
			case <-r.C:
				f.Read(f.o.Timeout)
			}
		}
	}()
	w := time.NewTicker(f.o.WriteEvery)
	defer w.Stop()
	for {
		select {
		case <-f.stop:
			f.Write(f.o.Timeout, true) // what it counted last, for the others
			<-reads
			return
		case <-w.C:
			f.Write(f.o.Timeout, false)
		}
	}
}

// Close stops the reads and writes, after a last write. Safe to call more
// than once.
func (f *StorageFleet) Close() {
	f.closing.Do(func() {
		close(f.stop)
		<-f.done
	})
}

// Write writes this instance's counts that have not faded, and forgets
// those that have, within timeout; final, with none and no secret, it
// deletes the file (with a secret, a deletion is no word: storagereplay.go).
func (f *StorageFleet) Write(timeout time.Duration, final bool) {
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	now := f.now()
	ns := now.UnixNano()
	file := StorageFile{Version: 1, Instance: f.id, At: ns, Until: ns, Stopped: final}
	f.mu.Lock()
	for id, c := range f.own {
		curr, prev := c.at(ns)
		if curr == 0 && prev == 0 {
			delete(f.own, id)
			continue
		}
		file.Buckets = append(file.Buckets, *c)
		file.Until = max(file.Until, c.Start+2*c.Period)
	}
	f.mu.Unlock()
	name := f.File(f.id)
	b, err := json.Marshal(file)
	if err == nil && f.key != nil {
		b = sign(f.key, b)
	}
	if err == nil && final && len(file.Buckets) == 0 && f.key == nil { // nothing to tell the others (caddy validate, an idle instance); see forgotten
		err = f.call(name, timeout, func(ctx context.Context) error { return f.st.Delete(ctx, name) })
		if errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
	} else if err == nil {
		err = f.call(name, timeout, func(ctx context.Context) error { return f.st.Store(ctx, name, b) })
	}
	if err != nil {
		err = fmt.Errorf("writing %s: %w", name, err)
	} else {
		f.wrote.Store(true)
		f.mu.Lock()
		f.lastWrite = now
		f.mu.Unlock()
	}
	f.reported(opWrite, err)
}

// newEpoch puts in force a read begun at now: the others' counts, the
// instances, and a new epoch (see unseen). The epoch that ends ends now,
// as it is put in force, not when the read began: what this instance
// charged while the read ran may be later than the others' files it
// read, and unseen counts it.
func (f *StorageFleet) newEpoch(now time.Time, rd reading) {
	slices.Sort(rd.ids)
	f.mu.Lock()
	f.others, f.n, f.ids, f.blind, f.lastRead = rd.others, rd.n, rd.ids, rd.blind, now
	f.epoch++
	f.epochAt[f.epoch%maxEpochs], f.oldest = f.now().UnixNano(), rd.oldest
	for _, c := range f.own {
		c.epochs[f.epoch%maxEpochs] = 0
	}
	f.mu.Unlock()
	f.gen.Add(1)
}
