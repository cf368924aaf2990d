package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// joinItems makes the queued commands of reqs, one request each, in mode
// modes[i] (take when empty), as a store of the given kind sends them.
func joinItems(t *testing.T, s *Store, reqs []bucket.Request, modes []scriptMode) []queued {
	t.Helper()
	items := make([]queued, len(reqs))
	for i, r := range reqs {
		mode := modeTake
		if i < len(modes) && modes[i] != "" {
			mode = modes[i]
		}
		one := []bucket.Request{r}
		sr := s.scriptRuns(one)[0]
		items[i] = queued{ctx: context.Background(), cmd: evalCmd(context.Background(), sr, true, "", mode, one, nil), i: i}
	}
	return items
}

// order is, for each item, the index of the unit it went in.
func order(us []unit) map[int]int {
	at := map[int]int{}
	for u, unit := range us {
		for _, it := range unit.items {
			at[it.i] = u
		}
	}
	return at
}

// TestJoinKeepsOrder: a command never passes an earlier one of the same
// slot in another call: a take of client X queued after a release of X
// (its previous request's slot) is decided after it, not joined to an
// earlier take. Outside a cluster, calls are runs of consecutive
// commands; in a cluster, a command joins the latest call of its kind
// unless a later one holds its tag: by tag (the cluster client's queue),
// the second take of another client joins its first; on a node, the
// latest take call (X's).
func TestJoinKeepsOrder(t *testing.T) {
	p := bucket.Policy{Algorithm: bucket.Concurrency, Slots: 1, Lease: time.Minute}
	for _, mode := range []joinMode{joinAny, joinByTag, joinByNode} {
		s, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "o:")
		if err != nil {
			t.Fatal(err)
		}
		reqs := []bucket.Request{{Zone: "z", Key: "other", Policy: p, Cost: 1, ID: "a"}, {Zone: "z", Key: "X", Policy: p, Cost: 1, ID: "r1"},
			{Zone: "z", Key: "X", Policy: p, Cost: 1, ID: "r2"}, {Zone: "z", Key: "other", Policy: p, Cost: 1, ID: "b"}}
		var j joiner
		at := order(j.join(joinItems(t, s, reqs, []scriptMode{modeTake, modeRelease, modeTake, modeTake}), mode))
		if at[2] <= at[1] {
			t.Errorf("mode %d: the take of X (unit %d) goes before the release of X queued before it (unit %d)", mode, at[2], at[1])
		}
		if want := map[joinMode]int{joinAny: at[2], joinByTag: at[0], joinByNode: at[2]}[mode]; at[3] != want {
			t.Errorf("mode %d: the second take of another client went in unit %d; want %d", mode, at[3], want)
		}
		j.reset()
		s.Close()
	}
}

// TestJoinBounded: a batched call holds at most maxJoinWeight of work:
// single-key takes go 64 to a call; sliding-log commands weigh their
// cost, and one heavier than the bound goes alone.
func TestJoinBounded(t *testing.T) {
	s, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "b:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var reqs []bucket.Request
	for i := range 256 {
		reqs = append(reqs, bucket.Request{Zone: "z", Key: fmt.Sprint("k", i), Policy: bucket.Policy{Rate: 1, Period: time.Second, Burst: 1}, Cost: 1})
	}
	var j joiner
	if us := j.join(joinItems(t, s, reqs, nil), joinAny); len(us) != 256/maxJoinWeight {
		t.Errorf("256 takes in %d calls; want %d", len(us), 256/maxJoinWeight)
	}
	j.reset()
	log := bucket.Policy{Algorithm: bucket.SlidingWindowLog, Rate: 100_000, Period: time.Second}
	reqs = reqs[:0]
	for i := range 20 {
		reqs = append(reqs, bucket.Request{Zone: "z", Key: fmt.Sprint("k", i), Policy: log, Cost: 10})
	}
	reqs = append(reqs, bucket.Request{Zone: "z", Key: "huge", Policy: log, Cost: 10_000})
	us := j.join(joinItems(t, s, reqs, nil), joinAny)
	for _, u := range us {
		w := 0
		for _, it := range u.items {
			p, _ := parseEval(it.cmd.Args())
			w += weight(p)
		}
		if len(u.items) > 1 && w > maxJoinWeight {
			t.Errorf("a call of %d sliding-log commands weighs %d; want at most %d", len(u.items), w, maxJoinWeight)
		}
	}
	if last := us[len(us)-1]; len(last.items) != 1 {
		t.Errorf("the request of cost 10,000 shares a call with %d others", len(last.items)-1)
	}
}

// BenchmarkJoin: the flusher's work to join a batch of 64 single-key
// takes of 64 clients into calls, then split a call's reply, per command:
// outside a cluster (one call), in the cluster client's queue (64 tags:
// none joins) and in a node's (one call).
func BenchmarkJoin(b *testing.B) {
	s, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "j:")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var reqs []bucket.Request
	for i := range 64 {
		reqs = append(reqs, bucket.Request{Zone: "z", Key: fmt.Sprint("k", i), Policy: bucket.Policy{Rate: 1, Period: time.Second, Burst: 1}, Cost: 1})
	}
	t := &testing.T{}
	items := joinItems(t, s, reqs, nil)
	reply := make([]int64, 1+len(items)*(1+replyPerKey))
	for _, mode := range []joinMode{joinAny, joinByTag, joinByNode} {
		b.Run(map[joinMode]string{joinAny: "standalone", joinByTag: "cluster_by_tag", joinByNode: "cluster_node"}[mode], func(b *testing.B) {
			var j joiner
			b.ReportAllocs()
			for b.Loop() {
				for _, u := range j.join(items, mode) {
					if u.sizes != nil {
						u.cmd.SetVal(reply)
						u.answer()
					}
				}
				j.reset()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/command")
		})
	}
}

// TestJoinModes: a store joins any adjacent commands on a standalone (or
// Sentinel) client, those of a node on a cluster client (by hash tag in
// the queue of commands the cluster client routes), and none on a client
// of another kind (a ring of shards, whose commands may hold several
// shards' keys, each with its own tag).
func TestJoinModes(t *testing.T) {
	for _, c := range []struct {
		client redis.UniversalClient
		want   joinMode
	}{
		{redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), joinAny},
		{redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), joinByNode},
		{redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}), joinNone},
	} {
		s, err := New(c.client, "m:")
		if err != nil {
			t.Fatal(err)
		}
		if s.batch.join != c.want {
			t.Errorf("%T: join mode %d; want %d", c.client, s.batch.join, c.want)
		}
		var reqs []bucket.Request
		for i := range 4 {
			reqs = append(reqs, bucket.Request{Zone: "z", Key: "same", Policy: bucket.Policy{Rate: 1, Period: time.Second, Burst: 9}, Cost: 1, ID: fmt.Sprint(i)})
		}
		var j joiner
		if us := j.join(joinItems(t, s, reqs, nil), s.batch.join); (len(us) == 1) != (c.want != joinNone) {
			t.Errorf("%T: 4 takes of one client in %d calls", c.client, len(us))
		}
		if q, err := s.batch.queue("", c.client); c.want == joinByNode && (err != nil || q.join != joinByTag) {
			t.Errorf("the cluster client's own queue joins in mode %d (%v); want by tag", q.join, err)
		}
		s.Close()
	}
}
