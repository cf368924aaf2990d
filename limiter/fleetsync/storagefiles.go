package fleetsync

// Reading the others' files of a storage fleet (see storage.go for
// the model). The directory is shared, and anything may lie in it: its
// files are read as untrusted input.
//
//   - Only ".json" files named as an instance names its own (16 hex
//     digits) are read; other ".json" files are skipped and reported, the
//     rest (a write's temporary files) left alone.
//   - On a file system (a Storage that is a FileSystem: Caddy's
//     file_system), the fleet lists the directory itself, following it when
//     it is a symlink (sharing only that directory), and reads regular files
//     only: a symlink, a device or a FIFO is skipped without being opened.
//     Every file is read with a byte limit, on any storage.
//   - A read has a budget for all the others' files together, of bytes
//     (bytesPerBucket a bucket) and of buckets (maxSyncEntries), spent on
//     the smallest files first: when it runs out the largest are skipped,
//     never the others because of one. An instance whose file is skipped so
//     and that wrote lately is blind: it counts in N, and its share of every
//     bucket is taken as spent (see blindShare).
//   - At most MaxStorageInstances instances are counted, this one included:
//     those that wrote last; the surplus is reported once (their counts
//     still count).
//
// A file skipped is reported once (its name and why, never a client key)
// until it reads well again; one whose content is at fault is not read
// again until it changes.

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Sizer is a Storage that tells a value's size, so that a file too large
// to be an instance's counts is not read.
type Sizer interface {
	Size(ctx context.Context, key string) (int64, error)
}

// FileSystem is a Storage whose values are files, Filename naming a key's
// (Caddy's file_system storage, certmagic.FileStorage): the fleet lists
// and reads its directory itself, regular files only.
type FileSystem interface {
	Filename(key string) string
}

// bytesPerBucket is what a bucket may take in a file (about 100 bytes, a
// long zone name more), and MaxFileSize bounds an instance's file, and
// the bytes read of all the others' files at a read: maxSyncEntries
// buckets.
const (
	bytesPerBucket = 160
	MaxFileSize    = maxSyncEntries * bytesPerBucket
)

// MaxStorageInstances bounds the instances a fleet counts, this one
// included.
const MaxStorageInstances = 64

// listed is a file of the fleet's directory, as listed.
type listed struct {
	key  string    // its key in the storage
	name string    // its base name
	size int64     // -1: unknown
	mod  time.Time // when written; zero: unknown
	bad  error     // not a regular file
}

// skipMark is what is remembered of a file skipped.
type skipMark struct {
	size   int64
	mod    time.Time
	sticky bool // its content is at fault: skipped again while unchanged
	blind  bool // skipped for the read's budget: its instance may count
}

// reading is what a read gathers of the others' files.
type reading struct {
	others  map[bucket.ID][]StorageCounts
	n       int64    // instances counted
	ids     []string // their names
	oldest  int64    // the oldest write of theirs read (Unix ns)
	blind   int64    // instances counted whose counts were not read
	entries int      // buckets read
	bytes   int64    // the bytes left to read
	files   []loaded // files read, to keep within the budget
	live    []seen   // the instances that wrote lately
}

// loaded is a file read.
type loaded struct {
	l          listed
	file       StorageFile
	remembered bool // not read: the last accepted (storagereplay.go)
}

// seen is an instance that wrote lately, at at (Unix ns).
type seen struct {
	name  string
	at    int64
	blind bool
}

// contentError is a file's content at fault (not its reading).
type contentError struct{ error }

// Read reads the others' files (see the model), deleting those to purge,
// within budget in all (a file whose call still runs past its timeout is
// skipped at once the next time): a Read cut short changes nothing.
func (f *StorageFleet) Read(budget time.Duration) {
	f.readMu.Lock()
	defer f.readMu.Unlock()
	now, start := f.now(), time.Now()
	rd := reading{others: map[bucket.ID][]StorageCounts{}, n: 1, ids: []string{f.id}, oldest: now.UnixNano(),
		bytes: int64(f.o.MaxEntries) * bytesPerBucket}
	err := f.gather(now, start.Add(budget), budget, &rd)
	if f.o.Read != nil {
		entries := rd.entries
		if err != nil {
			entries = 0
		}
		f.o.Read(entries, time.Since(start), err)
	}
	if err != nil {
		f.reported(opRead, err)
		return
	}
	f.newEpoch(now, rd)
	f.reported(opRead, nil)
}

// gather lists the fleet's directory and reads the files into rd, the
// smallest first, before deadline.
func (f *StorageFleet) gather(now, deadline time.Time, budget time.Duration, rd *reading) error {
	timeout := func() time.Duration { return max(min(f.o.Timeout, time.Until(deadline)), time.Millisecond) }
	var files []listed
	err := f.call(f.o.Dir, timeout(), func(ctx context.Context) (err error) {
		files, err = f.list(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("listing %s: %w", f.o.Dir, err)
	}
	listedNames := make(map[string]bool, len(files))
	for _, l := range files {
		listedNames[l.name] = true
	}
	for name := range f.skipped { // files gone: forgotten
		if !listedNames[name] {
			delete(f.skipped, name)
		}
	}
	slices.SortFunc(files, func(a, b listed) int { return cmp.Or(cmp.Compare(a.size, b.size), strings.Compare(a.name, b.name)) })
	for _, l := range files {
		if time.Now().After(deadline) {
			return fmt.Errorf("reading %s: the others' files took more than %s", f.o.Dir, budget)
		}
		f.readFile(now, l, timeout(), rd)
	}
	f.recall(now, rd)
	f.keep(now, rd)
	f.count(rd)
	return nil
}

// readFile reads the file l into rd, or skips it (and reports why), or
// deletes it when it is to purge.
func (f *StorageFleet) readFile(now time.Time, l listed, timeout time.Duration, rd *reading) {
	inst := strings.TrimSuffix(l.name, ".json")
	if inst == f.id {
		return
	}
	if m, ok := f.skipped[l.name]; ok && m.sticky && !l.mod.IsZero() && m.size == l.size && m.mod.Equal(l.mod) { // unchanged
		if m.blind {
			f.unread(now, inst, l, rd)
		}
		return
	}
	limit := min(rd.bytes, MaxFileSize)
	switch {
	case l.bad != nil:
		f.skip(l, l.bad, skipMark{})
		return
	case !instanceName(inst):
		f.skip(l, errors.New("not an instance's file: its name is not 16 hex digits"), skipMark{})
		return
	case l.size > MaxFileSize: // its instance, if it wrote lately, counts blind
		f.skip(l, fmt.Errorf("%d bytes: more than the %d an instance's counts take", l.size, MaxFileSize), skipMark{})
		f.unread(now, inst, l, rd)
		return
	case l.size > limit:
		f.skip(l, fmt.Errorf("%d bytes: more than the %d left of the read's budget (the largest files are skipped first)", l.size, limit), skipMark{})
		f.unread(now, inst, l, rd)
		return
	}
	file, n, err := f.load(l.key, inst, limit, timeout)
	rd.bytes -= n
	if err == nil && file.At > now.Add(maxAhead).UnixNano() {
		err = fmt.Errorf("written %s ahead of this instance's clock: check the clocks (NTP)", time.Duration(file.At-now.UnixNano()).Round(time.Second))
	} else if err == nil && f.key != nil {
		err = f.vouch(inst, file)
	}
	switch {
	case err != nil:
		f.skip(l, err, skipMark{sticky: errors.As(err, new(contentError))})
	case f.purge(now, file):
		_ = f.call(l.key, timeout, func(ctx context.Context) error { return f.st.Delete(ctx, l.key) }) // another instance may have deleted it first
	default:
		rd.files = append(rd.files, loaded{l: l, file: file})
	}
}

// instanceName reports whether s is named as an instance names itself.
func instanceName(s string) bool {
	_, err := hex.DecodeString(s)
	return len(s) == 16 && err == nil && strings.ToLower(s) == s
}

// live reports whether an instance that wrote at at (Unix ns) counts.
func (f *StorageFleet) live(now time.Time, at int64) bool {
	t := time.Unix(0, at)
	return now.Sub(t) <= max(InstancesWindow, 3*f.o.WriteEvery) && !t.After(now.Add(maxAhead)) // no file from the future
}

// unread notes in rd an instance whose file l was skipped for the read's
// budget: when it wrote lately, it counts, blind. With a secret, l's time
// is not the instance's word: its last signed file counts (recall).
func (f *StorageFleet) unread(now time.Time, inst string, l listed, rd *reading) {
	if f.key == nil && !l.mod.IsZero() && f.live(now, l.mod.UnixNano()) {
		rd.live = append(rd.live, seen{name: inst, at: l.mod.UnixNano(), blind: true})
	}
}

// keep puts the counts of the files read in rd, the files of the fewest
// buckets first, up to maxEntries buckets in all: a file past them is
// skipped, its instance blind.
func (f *StorageFleet) keep(now time.Time, rd *reading) {
	slices.SortStableFunc(rd.files, func(a, b loaded) int { return cmp.Compare(len(a.file.Buckets), len(b.file.Buckets)) })
	for _, fl := range rd.files {
		file := fl.file
		live, blind := f.standing(now, fl)
		if rd.entries+len(file.Buckets) > f.o.MaxEntries {
			if !fl.remembered { // a file remembered was reported as it was read
				f.skip(fl.l, fmt.Errorf("%d buckets: more than the %d left of the %d kept of all the others' files (the largest are skipped first)",
					len(file.Buckets), f.o.MaxEntries-rd.entries, f.o.MaxEntries), skipMark{sticky: true, blind: live})
			}
			if live {
				rd.live = append(rd.live, seen{name: file.Instance, at: file.At, blind: true})
			}
			continue
		}
		if !fl.remembered {
			delete(f.skipped, fl.l.name) // read well: reported again if it goes wrong
		}
		if live {
			rd.live = append(rd.live, seen{name: file.Instance, at: file.At, blind: blind})
		}
		for _, c := range file.Buckets {
			if id, ok := c.bucketID(); ok {
				rd.others[id] = append(rd.others[id], c)
				rd.entries++
				f.counted(time.Duration(c.Period))
			}
		}
	}
}

// count counts in rd the instances that wrote lately, up to
// MaxStorageInstances with this one: those that wrote last. A surplus is
// reported once, until there is none.
func (f *StorageFleet) count(rd *reading) {
	slices.SortFunc(rd.live, func(a, b seen) int { return cmp.Or(cmp.Compare(b.at, a.at), strings.Compare(a.name, b.name)) })
	surplus := len(rd.live) - (MaxStorageInstances - 1)
	if surplus > 0 && !f.surplus && f.o.Events != nil {
		f.o.Events.FileSkipped(f.o.Dir, fmt.Errorf("%d files of instances written lately: more than the %d instances counted; "+
			"the %d written last are counted with this one (files not written by this fleet?)", len(rd.live), MaxStorageInstances, MaxStorageInstances-1))
	}
	f.surplus = surplus > 0
	if surplus > 0 {
		rd.live = rd.live[:MaxStorageInstances-1]
	}
	for _, s := range rd.live {
		rd.n++
		rd.ids = append(rd.ids, s.name)
		if s.blind {
			rd.blind++
		} else {
			rd.oldest = min(rd.oldest, s.at)
		}
	}
}

// list lists the fleet's directory's ".json" files. On a FileSystem, the
// directory is read here (followed if a symlink; each file's type from
// Lstat). Else a file that goes between the listing and its look (a
// write's temporary file, renamed) fails the whole listing as not
// existing: it is listed again. The directory is missing only until this
// instance's first write.
func (f *StorageFleet) list(ctx context.Context) ([]listed, error) {
	if fsys, ok := f.st.(FileSystem); ok {
		files, err := f.listDir(fsys.Filename(f.o.Dir))
		if errors.Is(err, fs.ErrNotExist) && !f.wrote.Load() {
			return nil, nil // no instance wrote yet
		}
		return files, err
	}
	for try := 0; ; try++ {
		names, err := f.st.List(ctx, f.o.Dir, false)
		switch {
		case errors.Is(err, fs.ErrNotExist) && !f.wrote.Load():
			return nil, nil
		case errors.Is(err, fs.ErrNotExist) && try < 4:
			continue
		case err != nil:
			return nil, err
		}
		var files []listed
		for _, name := range names {
			if base := path.Base(name); strings.HasSuffix(base, ".json") {
				files = append(files, listed{key: path.Join(f.o.Dir, base), name: base, size: -1})
			}
		}
		return files, nil
	}
}

// listDir lists the ".json" files of dir, a directory of the file system.
func (f *StorageFleet) listDir(dir string) ([]listed, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []listed
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		info, err := e.Info() // Lstat's
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone since
		}
		l := listed{key: path.Join(f.o.Dir, e.Name()), name: e.Name(), size: -1}
		switch {
		case err != nil:
			l.bad = err
		case !info.Mode().IsRegular():
			l.bad = notRegular(info.Mode())
		default:
			l.size, l.mod = info.Size(), info.ModTime()
		}
		files = append(files, l)
	}
	return files, nil
}

// notRegular says what a file of mode m is, not being a regular file.
func notRegular(m fs.FileMode) error {
	what := "not a regular file"
	switch {
	case m&fs.ModeSymlink != 0:
		what = "a symlink"
	case m&fs.ModeDevice != 0:
		what = "a device"
	case m&fs.ModeNamedPipe != 0:
		what = "a FIFO"
	case m.IsDir():
		what = "a directory"
	}
	return fmt.Errorf("%s, not a regular file: not read", what)
}

// load reads, at most limit bytes, and checks the file key of instance
// inst; n is the bytes read.
func (f *StorageFleet) load(key, inst string, limit int64, timeout time.Duration) (file StorageFile, n int64, err error) {
	var b []byte
	err = f.call(key, timeout, func(ctx context.Context) (err error) {
		b, err = f.loadBytes(ctx, key, limit)
		return err
	})
	if err != nil {
		return file, 0, err // b may be written still, past the timeout
	}
	file, err = parseFile(b, inst, f.key)
	return file, int64(len(b)), err
}

// loadBytes reads the value of key, failing past limit bytes.
func (f *StorageFleet) loadBytes(ctx context.Context, key string, limit int64) ([]byte, error) {
	if fsys, ok := f.st.(FileSystem); ok {
		return ReadRegular(fsys.Filename(key), limit)
	}
	if s, ok := f.st.(Sizer); ok {
		size, err := s.Size(ctx, key)
		if err != nil {
			return nil, err
		}
		if size > limit {
			return nil, fmt.Errorf("%d bytes: more than the %d it may take", size, limit)
		}
	}
	b, err := f.st.Load(ctx, key)
	if err == nil && int64(len(b)) > limit {
		return nil, fmt.Errorf("%d bytes: more than the %d it may take", len(b), limit)
	}
	return b, err
}

// ReadRegular reads the regular file p, failing past limit bytes.
func ReadRegular(p string, limit int64) ([]byte, error) {
	// Neither a symlink followed nor a FIFO's open waited for: the file may
	// have been replaced since it was listed.
	file, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() { // replaced since it was listed
		return nil, notRegular(info.Mode())
	}
	b, err := io.ReadAll(io.LimitReader(file, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("more than the %d bytes it may take", limit)
	}
	return b, nil
}

// purge reports whether file is to be deleted at now.
func (f *StorageFleet) purge(now time.Time, file StorageFile) bool {
	written := now.Sub(time.Unix(0, file.At))
	if f.o.PurgeAge > 0 {
		return written > f.o.PurgeAge
	}
	return written > max(InstancesWindow, 3*f.o.WriteEvery) && now.UnixNano() > file.Until
}

// skip reports a file that could not be used, once until it reads well,
// remembering mark of it (its size and time are l's).
func (f *StorageFleet) skip(l listed, err error, mark skipMark) {
	_, was := f.skipped[l.name]
	mark.size, mark.mod = l.size, l.mod
	f.skipped[l.name] = mark
	if !was && f.o.Events != nil {
		f.o.Events.FileSkipped(l.name, err)
	}
}

// File is the name of an instance's File.
func (f *StorageFleet) File(instance string) string { return path.Join(f.o.Dir, instance+".json") }

// ID names this instance's file (<ID>.json).
func (f *StorageFleet) ID() string { return f.id }
