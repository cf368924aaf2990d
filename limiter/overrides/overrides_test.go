package overrides

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// overrideRecorder records the events of an Overrides.
type overrideRecorder struct {
	mu        sync.Mutex
	vias      []string
	skipped   []string
	failing   []error
	expired   []Entry
	lastSeen  *Set
	notPushed []error
	restored  []int    // the counts of the restores this instance wrote
	whys      []string // and why
	overLimit []string // the reports of more entries than an instance reads
}

func (r *overrideRecorder) OverridesRestored(n int, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restored = append(r.restored, n)
	r.whys = append(r.whys, why)
}

func (r *overrideRecorder) OverridesOverLimit(held, read int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.overLimit = append(r.overLimit, fmt.Sprintf("%d held, %d read", held, read))
}

// restores is what the restores this instance wrote restored, and why.
func (r *overrideRecorder) restores() ([]int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.restored...), append([]string(nil), r.whys...)
}

// restoresOf waits until the instances of recs wrote a restore, then
// until each of insts is on a version beyond held (the last before the
// loss: every restore is then written), and lists those written.
func restoresOf(t *testing.T, held int64, recs []*overrideRecorder, insts []*Overrides) ([]int, []string) {
	t.Helper()
	for i, o := range insts {
		waitFor(t, 10*time.Second, fmt.Sprintf("instance %d beyond version %d", i, held), func() bool { return o.Current().Version() > held })
	}
	var restores []int
	var whys []string
	waitFor(t, 10*time.Second, "a restore written", func() bool {
		restores, whys = nil, nil
		for _, r := range recs {
			n, w := r.restores()
			restores, whys = append(restores, n...), append(whys, w...)
		}
		return len(restores) > 0
	})
	return restores, whys
}

func (r *overrideRecorder) OverridesLoaded(s *Set, via string, expired []Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.vias, r.lastSeen = append(r.vias, via), s
	r.expired = append(r.expired, expired...)
}

func (r *overrideRecorder) OverrideSkipped(entry string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.skipped = append(r.skipped, entry+": "+err.Error())
}

func (r *overrideRecorder) OverridesFailing(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing = append(r.failing, err)
}

func (r *overrideRecorder) OverridesNotPushed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notPushed = append(r.notPushed, err)
}

func (r *overrideRecorder) snapshot() (vias, skipped []string, failing []error, expired []Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.vias...), append([]string(nil), r.skipped...), append([]error(nil), r.failing...), append([]Entry(nil), r.expired...)
}

func TestOverrideCheck(t *testing.T) {
	yes := true
	for _, c := range []struct {
		name string
		o    Override
		key  bool
		err  string
	}{
		{"zone rate", Override{Rate: "10r/m", Burst: 5}, false, ""},
		{"zone dry run", Override{DryRun: &yes}, false, ""},
		{"zone disabled", Override{Disabled: true, Expires: 1}, false, ""},
		{"key block", Override{Block: true}, true, ""},
		{"key exempt", Override{Exempt: true}, true, ""},
		{"key limit", Override{Rate: "100r/m", Burst: 100}, true, ""},
		{"bad rate", Override{Rate: "10r/x"}, false, "rate: "},
		{"negative burst", Override{Burst: -1}, false, "burst -1"},
		{"nothing", Override{}, false, "nothing to override"},
		{"block on a zone", Override{Block: true}, false, "apply to a key's override"},
		{"disabled on a key", Override{Disabled: true}, true, "apply to a zone's override"},
		{"block and exempt", Override{Block: true, Exempt: true}, true, "choose one"},
		{"block with a rate", Override{Block: true, Rate: "1r/s"}, true, "take no rate"},
		{"disabled with a rate", Override{Disabled: true, Rate: "1r/s"}, false, "disabled takes no"},
		{"by too long", Override{Rate: "1r/s", By: strings.Repeat("x", 300)}, false, "by: at most"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.o.Check(c.key)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("Check: %v", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("Check = %v, want an error with %q", err, c.err)
			}
		})
	}
	o := Override{Rate: "30r/10m"}
	if err := o.Check(false); err != nil {
		t.Fatal(err)
	}
	if n, p := o.RatePeriod(); n != 30 || p != 10*time.Minute {
		t.Fatalf("RatePeriod = %d, %s", n, p)
	}
}

// TestMemoryOverrides: a change is in force at once, a delete removes it,
// an expired one leaves the set (and is reported), lookups tell zones and
// keys apart.
func TestMemoryOverrides(t *testing.T) {
	rec := &overrideRecorder{}
	o := NewMemory(rec)
	var clock atomic.Int64 // ns; read by the background loop
	clock.Store(time.Now().UnixNano())
	o.now = func() time.Time { return time.Unix(0, clock.Load()) }
	if err := o.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ctx := context.Background()
	key := bucket.KeyHash("alice")
	if err := o.Put(ctx, "api", nil, Override{Rate: "10r/m"}); err != nil {
		t.Fatal(err)
	}
	if err := o.Put(ctx, "api", &key, Override{Rate: "100r/m", Expires: o.now().Add(time.Hour).UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	if err := o.Put(ctx, "api", &key, Override{Rate: "1r/x"}); err == nil {
		t.Fatal("Put of a malformed override: no error")
	}
	set := o.Current()
	if z, ok := set.Zone("api"); !ok || z.Rate != "10r/m" {
		t.Fatalf("zone override = %+v, %v", z, ok)
	}
	if k, ok := set.Key("api", key); !ok || k.Rate != "100r/m" {
		t.Fatalf("key override = %+v, %v", k, ok)
	}
	if _, ok := set.Key("api", bucket.KeyHash("bob")); ok || set.HasKeys("other") {
		t.Fatal("bob, or zone other, has an override")
	}
	if z, k := set.Count(o.now()); z != 1 || k != 1 {
		t.Fatalf("Count = %d zones, %d keys", z, k)
	}
	clock.Add(int64(time.Hour))
	if err := o.refresh(ctx, "poll", false); err != nil {
		t.Fatal(err)
	}
	if _, ok := o.Current().Key("api", key); ok {
		t.Fatal("the key's override outlived its expiry")
	}
	if _, _, _, expired := rec.snapshot(); len(expired) != 1 || expired[0].Zone != "api" || expired[0].Digest == "" {
		t.Fatalf("expired reported: %+v", expired)
	}
	if found, err := o.Delete(ctx, "api", nil); err != nil || !found {
		t.Fatalf("Delete = %v, %v", found, err)
	}
	if found, _ := o.Delete(ctx, "api", nil); found {
		t.Fatal("a second Delete found the override")
	}
	if _, ok := o.Current().Zone("api"); ok {
		t.Fatal("the zone's override survived its delete")
	}
}

// redisOverridesPair is two instances' overrides on one Redis, under a
// prefix of their own, with a short poll.
func redisOverridesPair(t *testing.T, c redis.UniversalClient) (a, b *Overrides, recB *overrideRecorder) {
	t.Helper()
	prefix := fmt.Sprintf("ovr%x:", rand.Uint64())
	a, recB = NewRedis(c, prefix, 0, &overrideRecorder{}), &overrideRecorder{}
	b = NewRedis(c, prefix, 0, recB)
	for _, o := range []*Overrides{a, b} {
		o.SetPoll(200 * time.Millisecond)
		if err := o.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(o.Close)
	}
	return a, b, recB
}

// waitFor polls cond until it holds, or fails after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRedisOverridesReachEveryInstance: a change made through one
// instance reaches another through the push (well before its poll), in a
// standalone Redis and in a Cluster (its shard channel).
func TestRedisOverridesReachEveryInstance(t *testing.T) {
	for name, c := range map[string]redis.UniversalClient{
		"standalone": redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)}),
		"cluster":    redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)}),
	} {
		t.Run(name, func(t *testing.T) {
			defer c.Close()
			a, b, recB := redisOverridesPair(t, c)
			b.SetPoll(time.Hour) // only the push can bring it
			time.Sleep(300 * time.Millisecond)
			key := bucket.KeyHash("premium")
			ctx := context.Background()
			if err := a.Put(ctx, "api", &key, Override{Rate: "100r/m", Burst: 100}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 2*time.Second, "the key's override at b", func() bool {
				o, ok := b.Current().Key("api", key)
				return ok && o.Burst == 100
			})
			if vias, _, _, _ := recB.snapshot(); !contains(vias, "push") {
				t.Fatalf("b read the change through %v, want a push", vias)
			}
			if _, err := a.Delete(ctx, "api", &key); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 2*time.Second, "the delete at b", func() bool {
				_, ok := b.Current().Key("api", key)
				return !ok
			})
			if name == "cluster" && !b.src.(*redisOverrides).shardedChannels(ctx) {
				t.Error("the cluster's instances do not use the shard channel (Redis 7 has it)")
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestRedisOverridesPollHeals: a change whose message is lost (none is
// published, as when the subscription was down) arrives at the next poll;
// a malformed or foreign entry is skipped and reported, the others load.
func TestRedisOverridesPollHeals(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	a, b, recB := redisOverridesPair(t, c)
	a.src.(*redisOverrides).quiet = true
	src := b.src.(*redisOverrides)
	src.scanCount = 2                  // the whole read in pages
	time.Sleep(300 * time.Millisecond) // b's subscription made, and read after
	ctx := context.Background()
	c.HSet(ctx, src.hash, "zone:junk", `{"rate":"1r/s", "burst": "secret-ish"}`, "key:zz:api", `{"rate":"1r/s"}`,
		"zone:newer", `{"rate":"1r/s","reason":"a field of a later version"}`)
	for i := range 20 {
		c.HSet(ctx, src.hash, fmt.Sprintf("zone:z%d", i), `{"rate":"1r/s"}`)
	}
	if err := a.Put(ctx, "api", nil, Override{Rate: "5r/m"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the zone's override at b through the poll", func() bool {
		o, ok := b.Current().Zone("api")
		return ok && o.Rate == "5r/m"
	})
	vias, skipped, _, _ := recB.snapshot()
	if !contains(vias, "poll") {
		t.Fatalf("b read the change through %v, want the poll", vias)
	}
	if len(skipped) != 2 || b.Current().Skipped() != 2 {
		t.Fatalf("skipped = %q, want the 2 malformed entries", skipped)
	}
	for _, s := range skipped {
		if strings.Contains(s, "secret-ish") {
			t.Errorf("a skipped entry's report shows its value: %s", s)
		}
	}
	if _, ok := b.Current().Zone("newer"); !ok {
		t.Error("an entry with a field of a later version was left out: what this version knows of it should apply")
	}
	if z, _ := b.Current().Count(time.Now()); z != 22 {
		t.Errorf("%d zone overrides read in pages, want 22", z)
	}
	if err := a.Put(ctx, "api", nil, Override{Rate: "6r/m"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the second change at b", func() bool { o, _ := b.Current().Zone("api"); return o.Rate == "6r/m" })
	if _, skipped, _, _ := recB.snapshot(); len(skipped) != 2 {
		t.Fatalf("the malformed entries were reported again on a second read: %q", skipped)
	}
}

// TestRedisOverridesKeepLastWhenDown: while Redis cannot be read, the last
// overrides stay in force, and the failure is reported once, as is the
// recovery.
func TestRedisOverridesKeepLastWhenDown(t *testing.T) {
	srv := redistest.NewServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond})
	defer c.Close()
	a, b, recB := redisOverridesPair(t, c)
	ctx := context.Background()
	if err := a.Put(ctx, "api", nil, Override{Rate: "5r/m", Expires: time.Now().Add(time.Hour).UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the override at b", func() bool { _, ok := b.Current().Zone("api"); return ok })
	srv.Pause()
	time.Sleep(time.Second) // several polls fail
	if _, ok := b.Current().Zone("api"); !ok {
		t.Fatal("the override was dropped while Redis was down")
	}
	srv.Resume()
	waitFor(t, 3*time.Second, "the recovery reported", func() bool {
		_, _, failing, _ := recB.snapshot()
		return len(failing) == 2
	})
	_, _, failing, _ := recB.snapshot()
	if failing[0] == nil || failing[1] != nil {
		t.Fatalf("failing = %v, want an error then nil", failing)
	}
}

// TestRedisOverridesExpireInRedis: an expired override is dropped from
// Redis by the next change, and never loaded.
func TestRedisOverridesExpireInRedis(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	a, _, _ := redisOverridesPair(t, c)
	ctx := context.Background()
	key := bucket.KeyHash("k")
	if err := a.Put(ctx, "api", &key, Override{Block: true, Expires: time.Now().Add(150 * time.Millisecond).UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := a.Put(ctx, "api", nil, Override{Rate: "1r/s"}); err != nil {
		t.Fatal(err)
	}
	src := a.src.(*redisOverrides)
	if n := c.HLen(ctx, src.hash).Val(); n != 1 {
		t.Fatalf("the hash holds %d entries, want the zone's alone", n)
	}
	if n := c.ZCard(ctx, src.expiry).Val(); n != 0 {
		t.Fatalf("the expiries hold %d entries, want none", n)
	}
	if _, ok := a.Current().Key("api", key); ok {
		t.Fatal("the expired override is in force")
	}
}

// TestRedisOverridesNotPushed: a Redis user whose ACL does not allow the
// channel (Redis 7's default for new users) gets no pushes; that is
// reported, and the poll still brings the changes.
func TestRedisOverridesNotPushed(t *testing.T) {
	srv := redistest.NewServer(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "gateway", "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "gateway", Password: "pw"})
	defer c.Close()
	rec := &overrideRecorder{}
	o := NewRedis(c, "acl:", 0, rec)
	o.src.(*redisOverrides).subscribeTimeout = 300 * time.Millisecond
	o.SetPoll(200 * time.Millisecond)
	if err := o.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	waitFor(t, 3*time.Second, "the missing subscription reported", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.notPushed) == 1
	})
	other := NewRedis(admin, "acl:", 0, &overrideRecorder{})
	defer other.Close()
	if err := other.Put(ctx, "api", nil, Override{Rate: "1r/s"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the change through the poll", func() bool { _, ok := o.Current().Zone("api"); return ok })
	// A change made by the user whose ACL lacks the channel is stored, in
	// force here at once, and not an error.
	if err := o.Put(ctx, "api2", nil, Override{Rate: "2r/s"}); err != nil {
		t.Fatalf("a change by a user without the channel: %v", err)
	}
	if _, ok := o.Current().Zone("api2"); !ok {
		t.Fatal("the change is not in force where it was made")
	}
}

// TestRedisOverridesWholeReadRacing: a whole read during which the
// overrides keep changing (three tries) is not taken for the version it
// ends at: the next poll reads them again, and the instance converges.
func TestRedisOverridesWholeReadRacing(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)})
	defer c.Close()
	a, b, _ := redisOverridesPair(t, c)
	ctx := context.Background()
	src := b.src.(*redisOverrides)
	a.src.(*redisOverrides).quiet = true // b reads through its whole reads alone
	var writes atomic.Int32
	src.afterScan = func() {
		if n := writes.Add(1); n <= 3 {
			_ = a.Put(ctx, "api", nil, Override{Rate: fmt.Sprintf("%dr/s", n+1)})
		}
	}
	if err := a.Put(ctx, "api", nil, Override{Rate: "1r/s"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "b on the last change", func() bool {
		o, _ := b.Current().Zone("api")
		return o.Rate == "4r/s"
	})
}

// TestRedisOverridesShardFailover: in a cluster, when the master of the
// overrides' slot fails over, Redis ends the shard subscriptions of its
// channel; the instances subscribe again, and pushes keep coming.
func TestRedisOverridesShardFailover(t *testing.T) {
	cl := redistest.NewClusterOf(t, 3, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer c.Close()
	a, b, recB := redisOverridesPair(t, c)
	b.SetPoll(time.Hour) // only pushes bring the changes
	ctx := context.Background()
	time.Sleep(300 * time.Millisecond)
	src := b.src.(*redisOverrides)
	master, err := c.MasterForKey(ctx, src.hash)
	if err != nil {
		t.Fatal(err)
	}
	var replica string
	for _, addr := range cl.Addrs() {
		n := redis.NewClient(&redis.Options{Addr: addr})
		info := n.Info(ctx, "replication").Val()
		n.Close()
		if strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+portOf(master.Options().Addr)+"\r\n") {
			replica = addr
		}
	}
	if replica == "" {
		t.Fatal("no replica of the overrides' master")
	}
	r := redis.NewClient(&redis.Options{Addr: replica})
	defer r.Close()
	if err := r.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the new master serving", func() bool {
		c.ReloadState(ctx)
		return a.Put(ctx, "probe", nil, Override{Rate: "1r/s"}) == nil
	})
	waitFor(t, 5*time.Second, "a change pushed after the failover", func() bool {
		_ = a.Put(ctx, "api", nil, Override{Rate: "7r/s"})
		o, _ := b.Current().Zone("api")
		return o.Rate == "7r/s"
	})
	if vias, _, _, _ := recB.snapshot(); !contains(vias, "push") && !contains(vias, "subscribe") {
		t.Fatalf("b read the changes through %v", vias)
	}
}

func portOf(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	return addr[i+1:]
}

// BenchmarkRedisOverridesRead: what an instance's read of the overrides
// costs with many of them in Redis: a whole read (HSCAN in pages, as a
// start, a missed message or a version of another name needs), and the
// read of one change pushed (HMGET of its entry).
func BenchmarkRedisOverridesRead(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(b)})
	defer c.Close()
	for _, n := range []int{10000, 100000} {
		o := NewRedis(c, fmt.Sprintf("bench%x:", rand.Uint64()), 0, &overrideRecorder{})
		src := o.src.(*redisOverrides)
		ctx := context.Background()
		p := c.Pipeline()
		for i := range n {
			d := bucket.KeyHash(fmt.Sprint("customer-", i))
			p.HSet(ctx, src.hash, overrideField("api", &d), `{"rate":"1000r/m","burst":1000}`)
		}
		p.Set(ctx, src.versionKey, "1:x", 0)
		if _, err := p.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("whole/%d", n), func(b *testing.B) {
			for b.Loop() {
				s, err := src.load(ctx, func(string, string, error) {})
				if err != nil {
					b.Fatal(err)
				}
				if _, k := s.Count(time.Now()); k != n {
					b.Fatalf("%d keys read, want %d", k, n)
				}
			}
		})
		d := bucket.KeyHash("customer-7")
		names := []string{overrideField("api", &d)}
		b.Run(fmt.Sprintf("one_change/%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := src.entries(ctx, names, func(string, string, error) {}); err != nil {
					b.Fatal(err)
				}
			}
		})
		c.Del(ctx, src.hash, src.versionKey)
	}
}

// BenchmarkOverrideApplyOneKey: a change of one key's override in a zone
// of 100,000 (what every instance does for each change it reads).
func BenchmarkOverrideApplyOneKey(b *testing.B) {
	var changes []entryChange
	for i := range 100000 {
		d := bucket.KeyHash(fmt.Sprint("customer-", i))
		changes = append(changes, entryChange{zone: "api", digest: &d, o: Override{Rate: "10r/s"}})
	}
	set := (*Set)(nil).apply(changes, "1:x")
	d := bucket.KeyHash("customer-7")
	one := []entryChange{{zone: "api", digest: &d, o: Override{Rate: "20r/s"}}}
	b.ReportAllocs()
	for b.Loop() {
		if s := set.apply(one, "2:y"); s.keys["api"].len() != 100000 {
			b.Fatal("a key lost")
		}
	}
}
