package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// joinItems makes the queued commands of reqs, one request each, in mode
// modes[i] (take when empty), as a store of the given kind sends them.
func joinItems(t *testing.T, s *RedisStore, reqs []Request, modes []string) []queued {
	t.Helper()
	items := make([]queued, len(reqs))
	for i, r := range reqs {
		mode := "take"
		if i < len(modes) && modes[i] != "" {
			mode = modes[i]
		}
		one := []Request{r}
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
// commands; in a cluster, of one hash tag, whatever other tags' commands
// come in between.
func TestJoinKeepsOrder(t *testing.T) {
	p := Policy{Algorithm: Concurrency, Burst: 1, Lease: time.Minute}
	for _, cluster := range []bool{false, true} {
		s, err := NewRedisStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "o:")
		if err != nil {
			t.Fatal(err)
		}
		reqs := []Request{{Zone: "z", Key: "other", Policy: p, Cost: 1, ID: "a"}, {Zone: "z", Key: "X", Policy: p, Cost: 1, ID: "r1"},
			{Zone: "z", Key: "X", Policy: p, Cost: 1, ID: "r2"}, {Zone: "z", Key: "other", Policy: p, Cost: 1, ID: "b"}}
		var j joiner
		at := order(j.join(joinItems(t, s, reqs, []string{"take", "release", "take", "take"}), map[bool]joinMode{false: joinAny, true: joinByTag}[cluster]))
		if at[2] <= at[1] {
			t.Errorf("cluster %v: the take of X (unit %d) goes before the release of X queued before it (unit %d)", cluster, at[2], at[1])
		}
		if cluster && at[3] != at[0] { // its own tag's commands since: none
			t.Errorf("cluster: the second take of another client (unit %d) did not join its first (unit %d)", at[3], at[0])
		}
		j.reset()
		s.Close()
	}
}

// TestJoinBounded: a batched call holds at most maxJoinWeight of work:
// single-key takes go 64 to a call; sliding-log commands weigh their
// cost, and one heavier than the bound goes alone.
func TestJoinBounded(t *testing.T) {
	s, err := NewRedisStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "b:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var reqs []Request
	for i := range 256 {
		reqs = append(reqs, Request{Zone: "z", Key: fmt.Sprint("k", i), Policy: Policy{Rate: 1, Period: time.Second, Burst: 1}, Cost: 1})
	}
	var j joiner
	if us := j.join(joinItems(t, s, reqs, nil), joinAny); len(us) != 256/maxJoinWeight {
		t.Errorf("256 takes in %d calls; want %d", len(us), 256/maxJoinWeight)
	}
	j.reset()
	log := Policy{Algorithm: SlidingWindowLog, Rate: 100_000, Period: time.Second}
	reqs = reqs[:0]
	for i := range 20 {
		reqs = append(reqs, Request{Zone: "z", Key: fmt.Sprint("k", i), Policy: log, Cost: 10})
	}
	reqs = append(reqs, Request{Zone: "z", Key: "huge", Policy: log, Cost: 10_000})
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
// takes into calls, then split a call's reply, per command: outside a
// cluster (one call), and in one (64 tags: none joins).
func BenchmarkJoin(b *testing.B) {
	s, err := NewRedisStore(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "j:")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var reqs []Request
	for i := range 64 {
		reqs = append(reqs, Request{Zone: "z", Key: fmt.Sprint("k", i), Policy: Policy{Rate: 1, Period: time.Second, Burst: 1}, Cost: 1})
	}
	t := &testing.T{}
	items := joinItems(t, s, reqs, nil)
	reply := make([]int64, 1+len(items)*(1+replyPerKey))
	for _, cluster := range []bool{false, true} {
		b.Run(fmt.Sprint("cluster=", cluster), func(b *testing.B) {
			var j joiner
			b.ReportAllocs()
			for b.Loop() {
				for _, u := range j.join(items, map[bool]joinMode{false: joinAny, true: joinByTag}[cluster]) {
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
// Sentinel) client, by hash tag on a cluster client, and none on a client
// of another kind (a ring of shards, whose commands may hold several
// shards' keys, each with its own tag).
func TestJoinModes(t *testing.T) {
	for _, c := range []struct {
		client redis.UniversalClient
		want   joinMode
	}{
		{redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), joinAny},
		{redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}), joinByTag},
		{redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}), joinNone},
	} {
		s, err := NewRedisStore(c.client, "m:")
		if err != nil {
			t.Fatal(err)
		}
		if s.batch.join != c.want {
			t.Errorf("%T: join mode %d; want %d", c.client, s.batch.join, c.want)
		}
		var reqs []Request
		for i := range 4 {
			reqs = append(reqs, Request{Zone: "z", Key: "same", Policy: Policy{Rate: 1, Period: time.Second, Burst: 9}, Cost: 1, ID: fmt.Sprint(i)})
		}
		var j joiner
		if us := j.join(joinItems(t, s, reqs, nil), s.batch.join); (len(us) == 1) != (c.want != joinNone) {
			t.Errorf("%T: 4 takes of one client in %d calls", c.client, len(us))
		}
		s.Close()
	}
}
