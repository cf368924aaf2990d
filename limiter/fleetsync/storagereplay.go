package fleetsync

// What a storage fleet with a secret remembers of the others' signed
// files (see storagemac.go): the last file it accepted of each instance,
// against replays, and in the place of a file it cannot accept.
//
//   - A signed file written before the one of its instance accepted last
//     (its signed write time, At, older) is a replay: whoever can write
//     the directory put an older file back, its counts lower. It is
//     ignored and reported once.
//   - An instance whose last accepted file is remembered and that did not
//     say it stopped (Stopped) is hidden when a read does not accept its
//     file (missing, unreadable, unsigned, wrongly signed, a replay, a
//     copy, from the future, too large to read), or when the file
//     accepted was not rewritten within InstancesWindow: it counts blind
//     (in N, its share of every bucket taken as spent: blindShare), its
//     last counts still counted, until it is forgotten (the horizon).
//     Whoever hides it squeezes the others by its share, and lifts
//     nothing: it admits what it sees left, at most its share of what the
//     others see left, less its counts, which they count.
//   - The horizon (forgotten): PurgeAge after the instance's last accepted
//     file was written, when set; else once that file would be purged
//     (its counts faded, InstancesWindow past) and two of the longest
//     window this instance has counted (a request of its own, or a count
//     read) have passed since it was written. An instance that crashed,
//     having said nothing, counts blind as long.
//   - An instance says it stops by its last file, Stopped, signed: with a
//     secret it writes one even when it holds nothing (a file deleted
//     is no word). It is then no instance at the next read.
//   - A file is remembered until its instance is forgotten, at most
//     maxRemembered files, those written last.
//
// Without a secret nothing is remembered: a file is what it says.

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// maxRemembered bounds the files remembered.
const maxRemembered = 4 * MaxStorageInstances

// vouch checks that file, of instance inst, read with a secret, is
// no replay, and remembers it.
func (f *StorageFleet) vouch(inst string, file StorageFile) error {
	if last, ok := f.signed[inst]; ok && file.At < last.At {
		return contentError{fmt.Errorf("written %s before the file of this instance read last: a replay of an older file? ignored",
			time.Duration(last.At-file.At).Round(time.Millisecond))}
	}
	if _, ok := f.signed[inst]; !ok && len(f.signed) >= maxRemembered {
		oldest := slices.MinFunc(slices.Collect(maps.Keys(f.signed)), func(a, b string) int { return cmp.Compare(f.signed[a].At, f.signed[b].At) })
		delete(f.signed, oldest)
	}
	f.signed[inst] = file
	return nil
}

// recall puts in rd, for every instance remembered whose file rd did not
// accept, its last accepted file; it forgets those past the horizon.
func (f *StorageFleet) recall(now time.Time, rd *reading) {
	if f.key == nil {
		return
	}
	read := make(map[string]bool, len(rd.files))
	for _, fl := range rd.files {
		read[fl.file.Instance] = true
	}
	for inst, file := range f.signed {
		switch {
		case f.forgotten(now, file):
			delete(f.signed, inst)
		case !read[inst]:
			rd.files = append(rd.files, loaded{l: listed{key: f.File(inst), name: inst + ".json", size: -1}, file: file, remembered: true})
		}
	}
}

// standing is how the file fl, read or recalled, counts its instance:
// live, an instance; blind, its share taken as spent (see the top).
func (f *StorageFleet) standing(now time.Time, fl loaded) (live, blind bool) {
	file := fl.file
	live = !file.Stopped && f.live(now, file.At)
	if f.key == nil || file.Stopped || live && !fl.remembered {
		return live, false
	}
	return !f.forgotten(now, file), true // hidden: unread, or not rewritten
}

// forgotten reports whether the instance whose last accepted file is
// file is past the horizon at now (see the top).
func (f *StorageFleet) forgotten(now time.Time, file StorageFile) bool {
	if !f.purge(now, file) {
		return false
	}
	return f.o.PurgeAge > 0 || now.Sub(time.Unix(0, file.At)) > 2*time.Duration(f.longest.Load())
}

// counted notes a window of period d counted (see forgotten).
func (f *StorageFleet) counted(d time.Duration) {
	for {
		cur := f.longest.Load()
		if int64(d) <= cur || f.longest.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}
