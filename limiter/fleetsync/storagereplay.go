package fleetsync

// What a storage fleet with a secret remembers of the others' signed
// files (see storagemac.go): the last file it accepted of each instance,
// against replays, and in the place of a file it cannot accept.
//
//   - A signed file written before the one of its instance accepted last
//     (its signed write time, At, older) is a replay: whoever can write
//     the directory put an older file back, its counts lower. It is
//     ignored and reported once.
//   - An instance whose file a read does not accept (missing, unsigned,
//     wrongly signed, a replay, a copy, from the future, too large to
//     read) and whose last accepted file is remembered is counted from
//     that file: its counts as they were, an instance while that file's
//     write time is within InstancesWindow (and it did not say it
//     stopped). An attacker who deletes or rewrites an instance's file
//     hides what it admitted since, no more; after InstancesWindow the
//     instance is no longer counted.
//   - A file is remembered until it would be purged (see purge), at most
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
// accept, its last accepted file; it forgets those to purge.
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
		case f.purge(now, file):
			delete(f.signed, inst)
		case !read[inst]:
			rd.files = append(rd.files, loaded{l: listed{key: f.File(inst), name: inst + ".json", size: -1}, file: file, remembered: true})
		}
	}
}
