package limiter

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/memstore"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/redisstore"
)

const ms = time.Millisecond

func TestFixedWindow(t *testing.T) {
	p := Policy{Algorithm: FixedWindow, Rate: 3, Period: time.Second, Burst: 3}
	runSteps(t, p, []step{
		{0, 1, true, 2, time.Second, 0, 0},
		{0, 1, true, 1, time.Second, 0, 0},
		{0, 1, true, 0, time.Second, 0, 0},
		{500 * ms, 1, false, 0, time.Second, 500 * ms, 0},
		{time.Second, 2, true, 1, 2 * time.Second, 0, 0}, // a new window
		{1500 * ms, 2, false, 1, 2 * time.Second, 500 * ms, 0},
		{1500 * ms, 1, true, 0, 2 * time.Second, 0, 0},
		{5 * time.Second, 4, false, 3, 6 * time.Second, time.Second, 0}, // more than the limit
	})
}

// TestQuota: a calendar quota counts to its limit and refuses until its
// period's end, in its time zone: t0 is 01:00 on 30 November in Auckland
// (NZDT, +13), whose next midnight is 23 hours on; a week in UTC ends on
// Monday, 12 hours after t0 (a Sunday's noon); a month in New York at
// 00:00 EST on 1 December, 41 hours on.
func TestQuota(t *testing.T) {
	akl, _ := bucket.LoadLocation("Pacific/Auckland")
	ny, _ := bucket.LoadLocation("America/New_York")
	h := time.Hour
	day := Policy{Algorithm: Quota, Rate: 3, Period: bucket.Day.Nominal(), Burst: 3, Calendar: bucket.Calendar{Unit: bucket.Day, Loc: akl}}
	runSteps(t, day, []step{
		{0, 1, true, 2, 23 * h, 0, 0},
		{0, 2, true, 0, 23 * h, 0, 0},
		{time.Hour, 1, false, 0, 23 * h, 22 * h, 0},
		{23*h - time.Microsecond, 1, false, 0, 23 * h, time.Microsecond, 0},
		{23 * h, 1, true, 2, 47 * h, 0, 0}, // a new day in Auckland
		{23 * h, 4, false, 2, 47 * h, 24 * h, 0},
	})
	week := Policy{Algorithm: Quota, Rate: 2, Period: bucket.Week.Nominal(), Burst: 2, Calendar: bucket.Calendar{Unit: bucket.Week}}
	runSteps(t, week, []step{
		{0, 2, true, 0, 12 * h, 0, 0},
		{11 * h, 1, false, 0, 12 * h, h, 0},
		{12 * h, 1, true, 1, 12*h + 7*24*h, 0, 0},
	})
	month := Policy{Algorithm: Quota, Rate: 2, Period: bucket.Month.Nominal(), Burst: 2, Calendar: bucket.Calendar{Unit: bucket.Month, Loc: ny}}
	runSteps(t, month, []step{
		{0, 2, true, 0, 41 * h, 0, 0},
		{40 * h, 1, false, 0, 41 * h, h, 0},
		{41 * h, 2, true, 0, 41*h + 31*24*h, 0, 0},
	})
}

func TestSlidingWindowLog(t *testing.T) {
	p := Policy{Algorithm: SlidingWindowLog, Rate: 3, Period: time.Second, Burst: 3}
	runSteps(t, p, []step{
		{0, 1, true, 2, time.Second, 0, 0}, // Reset: when the oldest counted request leaves
		{100 * ms, 1, true, 1, time.Second, 0, 0},
		{200 * ms, 1, true, 0, time.Second, 0, 0},
		{500 * ms, 1, false, 0, time.Second, 500 * ms, 0},
		{time.Second, 1, true, 0, 1100 * ms, 0, 0}, // the request at 0 has left
		{1050 * ms, 1, false, 0, 1100 * ms, 50 * ms, 0},
		{1050 * ms, 2, false, 0, 1100 * ms, 150 * ms, 0}, // two must leave: 100ms and 200ms
		{1050 * ms, 4, false, 0, 1100 * ms, time.Second, 0},
		{3 * time.Second, 3, true, 0, 4 * time.Second, 0, 0},
	})
}

// TestSlidingWindowLogMixedWindows: two sliding log zones of different
// windows on one client are decided in one script run, each with its own
// window: a client idle for longer than the short window, but not the
// long one, is counted right (the script once read each key with the
// previous key's window, and failed on that client).
func TestSlidingWindowLogMixedWindows(t *testing.T) {
	short := Policy{Algorithm: SlidingWindowLog, Rate: 3, Period: time.Second, Burst: 3}
	long := Policy{Algorithm: SlidingWindowLog, Rate: 5, Period: time.Minute, Burst: 5}
	steps := []struct {
		at          time.Duration // since t0
		short, long Decision      // remaining and reset (since t0) of each zone
	}{
		{0, Decision{Remaining: 2, Reset: t0.Add(time.Second)}, Decision{Remaining: 4, Reset: t0.Add(time.Minute)}},
		{2 * time.Second, Decision{Remaining: 2, Reset: t0.Add(3 * time.Second)}, Decision{Remaining: 3, Reset: t0.Add(time.Minute)}},
		{2 * time.Second, Decision{Remaining: 1, Reset: t0.Add(3 * time.Second)}, Decision{Remaining: 2, Reset: t0.Add(time.Minute)}},
	}
	for name, newStore := range testStores {
		t.Run(name, func(t *testing.T) {
			take := newStore(t)
			for i, st := range steps {
				reqs := []Request{
					{Zone: "short", Key: "k", Policy: short, Cost: 1, ID: fmt.Sprint("short-", i)},
					{Zone: "long", Key: "k", Policy: long, Cost: 1, ID: fmt.Sprint("long-", i)},
				}
				d, err := take(t0.Add(st.at), reqs)
				if err != nil {
					t.Fatalf("step %d (at %s): %v", i, st.at, err)
				}
				for j, want := range []Decision{st.short, st.long} {
					want.Allowed, want.Limit = true, reqs[j].Policy.Limit()
					if !sameDecision(d[j], want) {
						t.Fatalf("step %d (at %s), zone %s:\n got %+v\nwant %+v", i, st.at, reqs[j].Zone, d[j], want)
					}
				}
			}
		})
	}
}

func TestSlidingWindowCounter(t *testing.T) {
	p := Policy{Algorithm: SlidingWindowCounter, Rate: 10, Period: time.Second, Burst: 10}
	runSteps(t, p, []step{
		{0, 10, true, 0, 2 * time.Second, 0, 0},
		// 10 in this window: the next window, once 10% of the previous
		// one has left the sliding window.
		{500 * ms, 1, false, 0, 2 * time.Second, 600 * ms, 0},
		{1100 * ms, 1, true, 0, 3 * time.Second, 0, 0},                    // 10*0.9 + 1
		{1500 * ms, 1, true, 3, 3 * time.Second, 0, 0},                    // 10*0.5 + 2
		{1500 * ms, 4, false, 3, 3 * time.Second, 100 * ms, 0},            // 10*0.4 + 2 + 4 fits at 1.6s
		{4 * time.Second, 11, false, 10, 5 * time.Second, time.Second, 0}, // more than the limit
	})
}

func TestLeakyBucket(t *testing.T) {
	p := Policy{Algorithm: LeakyBucket, Rate: 10, Period: time.Second, Burst: 2} // one every 100ms
	runSteps(t, p, []step{
		{0, 1, true, 2, 100 * ms, 0, 0},
		{0, 1, true, 1, 200 * ms, 0, 100 * ms}, // waits for its slot
		{0, 1, true, 0, 300 * ms, 0, 200 * ms},
		{0, 1, false, 0, 300 * ms, 100 * ms, 0}, // the queue is full
		{150 * ms, 1, true, 0, 400 * ms, 0, 150 * ms},
		{time.Second, 1, true, 2, 1100 * ms, 0, 0},
	})
	p.NoDelay = true
	runSteps(t, p, []step{
		{0, 1, true, 2, 100 * ms, 0, 0},
		{0, 1, true, 1, 200 * ms, 0, 0}, // nodelay: the burst passes at once
		{0, 1, true, 0, 300 * ms, 0, 0},
		{0, 1, false, 0, 300 * ms, 100 * ms, 0},
	})
}

// TestLeakyBucketFractionalInterval: the last place of the queue is not
// lost to rounding when the interval is no whole number of µs.
func TestLeakyBucketFractionalInterval(t *testing.T) {
	third := 333334 * time.Microsecond // 333,333.33µs, rounded up
	runSteps(t, Policy{Algorithm: LeakyBucket, Rate: 3, Period: time.Second, Burst: 5}, []step{
		{0, 1, true, 5, third, 0, 0},
		{0, 1, true, 4, 666667 * time.Microsecond, 0, third},
	})
	runSteps(t, Policy{Algorithm: LeakyBucket, Rate: 3, Period: time.Second, Burst: 1}, []step{
		{0, 1, true, 1, third, 0, 0},
		{0, 1, true, 0, 666667 * time.Microsecond, 0, third},
		{0, 1, false, 0, 666667 * time.Microsecond, third, 0},
	})
	eighth := 7813 * time.Microsecond // 7,812.5µs
	runSteps(t, Policy{Algorithm: LeakyBucket, Rate: 128, Period: time.Second, Burst: 1}, []step{
		{0, 1, true, 1, eighth, 0, 0},
		{0, 1, true, 0, 15625 * time.Microsecond, 0, eighth},
		{0, 3, false, 0, 15625 * time.Microsecond, eighth, 0}, // more than burst + 1
	})
}

// TestBoundaryBurst: across a window's edge, the fixed window lets about
// twice its limit through; the sliding log and the token bucket do not.
func TestBoundaryBurst(t *testing.T) {
	want := map[Algorithm]int{FixedWindow: 20, SlidingWindowLog: 10, SlidingWindowCounter: 10, TokenBucket: 11}
	for a, n := range want {
		for name, newStore := range testStores {
			t.Run(a.String()+"/"+name, func(t *testing.T) {
				take := newStore(t)
				p := Policy{Algorithm: a, Rate: 10, Period: time.Second, Burst: 10}
				passed := 0
				// 10 requests at 0.9s, then 10 at 1.0s, across the edge at 1s.
				for _, at := range []time.Duration{900 * ms, time.Second} {
					for range 10 {
						d, err := take(t0.Add(at), []Request{{Zone: "z", Key: "k", Policy: p, Cost: 1}})
						if err != nil {
							t.Fatal(err)
						}
						if d[0].Allowed {
							passed++
						}
					}
				}
				if passed != n {
					t.Fatalf("%d of 20 passed in 100ms around the edge; want %d", passed, n)
				}
			})
		}
	}
}

// concurrencyStores make stores with Take at a given time and Release.
var concurrencyStores = map[string]func(t *testing.T) (takeAtFunc, Store){
	"memory": func(t *testing.T) (takeAtFunc, Store) {
		s := memstore.New(time.Hour)
		t.Cleanup(func() { s.Close() })
		return func(now time.Time, reqs []Request) ([]Decision, error) { return s.TakeAt(now, reqs), nil }, s
	},
	"redis": func(t *testing.T) (takeAtFunc, Store) {
		s := newRedisStore(t, redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)}))
		return redisTakeAt(s), s
	},
	"cluster": func(t *testing.T) (takeAtFunc, Store) {
		s := newRedisStore(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)}))
		return redisTakeAt(s), s
	},
}

func TestConcurrency(t *testing.T) {
	p := Policy{Algorithm: Concurrency, Slots: 2, Lease: time.Minute}
	req := func(lease string) []Request {
		return []Request{{Zone: "z", Key: "k", Policy: p, Cost: 1, ID: lease}}
	}
	for name, newStore := range concurrencyStores {
		t.Run(name, func(t *testing.T) {
			take, s := newStore(t)
			now := time.Now()
			for i, want := range []bool{true, true, false} {
				d, err := take(now, req(fmt.Sprint("lease-", i)))
				if err != nil || d[0].Allowed != want || d[0].Limit != 2 {
					t.Fatalf("request %d: %+v, %v; want allowed %v", i, d, err, want)
				}
			}
			if err := s.Release(context.Background(), req("lease-0")); err != nil {
				t.Fatal(err)
			}
			if d, err := take(now, req("lease-3")); err != nil || !d[0].Allowed || d[0].Remaining != 0 {
				t.Fatalf("after a release: %+v, %v; want allowed with 0 free", d, err)
			}
		})
	}
}

// TestConcurrencyLeasesExpire: in Redis, the slots of a Caddy that died
// without releasing them come back when their leases end.
func TestConcurrencyLeasesExpire(t *testing.T) {
	s := newRedisStore(t, redis.NewClient(&redis.Options{Addr: redistest.StandaloneAddr(t)}))
	p := Policy{Algorithm: Concurrency, Slots: 1, Lease: time.Second}
	req := func(lease string) []Request {
		return []Request{{Zone: "z", Key: "k", Policy: p, Cost: 1, ID: lease}}
	}
	if d, err := s.TakeAt(t.Context(), t0, req("a")); err != nil || !d[0].Allowed {
		t.Fatal(d, err)
	}
	if d, err := s.TakeAt(t.Context(), t0.Add(500*ms), req("b")); err != nil || d[0].Allowed {
		t.Fatal("a second request while the first holds its lease", d, err)
	}
	if d, err := s.TakeAt(t.Context(), t0.Add(1500*ms), req("c")); err != nil || !d[0].Allowed {
		t.Fatal("the lease of a crashed holder did not expire", d, err)
	}
}

// TestMixedAlgorithmsAllOrNothing: zones of different algorithms on one
// request are charged all or nothing too.
func TestMixedAlgorithmsAllOrNothing(t *testing.T) {
	for name, newStore := range testStores {
		t.Run(name, func(t *testing.T) {
			take := newStore(t)
			loose := Request{Zone: "log", Key: "k", Policy: Policy{Algorithm: SlidingWindowLog, Rate: 100, Period: time.Minute, Burst: 100}, Cost: 1}
			tight := Request{Zone: "fixed", Key: "other", Policy: Policy{Algorithm: FixedWindow, Rate: 2, Period: time.Minute, Burst: 2}, Cost: 1}
			for i := range 4 {
				loose.ID = fmt.Sprint("request-", i) // the log's refund removes exactly its entries
				d, err := take(t0, []Request{loose, tight})
				if err != nil {
					t.Fatal(err)
				}
				if d[1].Allowed != (i < 2) {
					t.Fatalf("request %d: tight zone allowed %v", i, d[1].Allowed)
				}
			}
			if d, err := take(t0, []Request{loose}); err != nil || d[0].Remaining != 97 {
				t.Fatalf("log zone remaining %d (%v); want 97: refusals took nothing", d[0].Remaining, err)
			}
		})
	}
}

// TestAlgorithmChange: a zone whose algorithm changes (a config reload)
// starts afresh: no algorithm reads another's state, in memory or in
// Redis (where the shapes differ: strings, sorted sets).
func TestAlgorithmChange(t *testing.T) {
	for name, newStore := range concurrencyStores {
		t.Run(name, func(t *testing.T) {
			take, _ := newStore(t)
			for i, a := range []Algorithm{TokenBucket, SlidingWindowLog, Concurrency, FixedWindow, Quota, SlidingWindowCounter, LeakyBucket, TokenBucket} {
				p := withCalendar(Policy{Algorithm: a, Rate: 100, Period: time.Minute, Burst: 100, Slots: 100, Lease: time.Minute})
				d, err := take(t0.Add(time.Duration(i)*ms), []Request{{Zone: "z", Key: "k", Policy: p, Cost: 1, ID: "l"}})
				if err != nil || !d[0].Allowed {
					t.Fatalf("%s after another algorithm: %+v, %v", a, d, err)
				}
			}
		})
	}
}

// TestPeekAndReset: getCurrentUsage and a reset, for every algorithm and
// store; a peek changes nothing.
func TestPeekAndReset(t *testing.T) {
	for name, newStore := range concurrencyStores {
		t.Run(name, func(t *testing.T) {
			_, s := newStore(t)
			ctx := context.Background()
			for _, a := range []Algorithm{TokenBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket, Concurrency, Quota} {
				p := withCalendar(Policy{Algorithm: a, Rate: 5, Period: time.Hour, Burst: 5, Slots: 5, Lease: time.Hour})
				req := Request{Zone: "z", Key: "peek-" + a.String(), Policy: p, Cost: 1}
				for i := range 3 {
					req.ID = fmt.Sprint("r", i)
					if _, err := s.Take(ctx, []Request{req}); err != nil {
						t.Fatal(err)
					}
				}
				want := p.Limit() - 3
				// A peek with another policy (the admin API reading a zone
				// whose rate comes from placeholders) changes nothing.
				other := req
				other.Policy.Rate, other.Policy.Period, other.Policy.Burst, other.Policy.Slots = 50, time.Second, 50, 50
				if _, err := s.Peek(ctx, other); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if d, err := s.Peek(ctx, req); err != nil || d.Remaining != want {
						t.Fatalf("%s: Peek = %+v, %v; want %d remaining", a, d, err, want)
					}
				}
				if err := s.Reset(ctx, req); err != nil {
					t.Fatal(err)
				}
				if d, err := s.Peek(ctx, req); err != nil || d.Remaining != p.Limit() {
					t.Fatalf("%s: after Reset: %+v, %v; want %d remaining", a, d, err, p.Limit())
				}
			}
		})
	}
}

// TestBans: three refusals within a minute ban the client for an hour,
// across instances (two Redis stores on one Redis) and whatever its bucket
// holds; a reset lifts the ban.
func TestBans(t *testing.T) {
	for name, newStore := range concurrencyStores {
		t.Run(name, func(t *testing.T) {
			_, s := newStore(t)
			other := s
			if rs, ok := s.(*redisstore.Store); ok { // a second instance: a client of its own, to the same Redis
				var c redis.UniversalClient
				switch first := rs.Client().(type) {
				case *redis.ClusterClient:
					c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: first.Options().Addrs})
				case *redis.Client:
					c = redis.NewClient(&redis.Options{Addr: first.Options().Addr})
				}
				o, _ := redisstore.New(c, rs.Prefix())
				t.Cleanup(func() { o.Close() })
				other = o
			}
			ctx := context.Background()
			p := Policy{Rate: 1, Period: time.Hour, Burst: 1, Ban: Ban{After: 3, Within: time.Minute, For: time.Hour}}
			r := Request{Zone: "z", Key: "offender", Policy: p, Cost: 1}
			for i, st := range []Store{s, other, s} {
				left, started, err := st.Refused(ctx, r)
				if err != nil || started != (i == 2) || (left > 0) != (i == 2) {
					t.Fatalf("refusal %d: %s %v %v", i+1, left, started, err)
				}
			}
			for _, st := range []Store{s, other} {
				left, err := st.Banned(ctx, []Request{{Zone: "z", Key: "innocent", Policy: p}, r})
				if err != nil || left[0] != 0 || left[1] < 59*time.Minute || left[1] > time.Hour {
					t.Fatalf("Banned = %v, %v; want the offender banned for an hour, nobody else", left, err)
				}
			}
			if left, started, _ := other.Refused(ctx, r); started || left < 59*time.Minute {
				t.Fatalf("a refusal while banned: %s %v; want the ban left, not a new one", left, started)
			}
			if err := other.Reset(ctx, r); err != nil {
				t.Fatal(err)
			}
			if left, _ := s.Banned(ctx, []Request{r}); left[0] != 0 {
				t.Fatalf("banned %s after a reset", left[0])
			}
		})
	}
}

// TestHugeCost: a cost from a placeholder may be anything up to
// math.MaxInt64. A cost over the limit is refused, on every algorithm and
// store, with no error, no panic and no wrapped count, and charges nothing:
// the next request of cost 1 gets exactly the usual remaining. (The
// concurrency limit is left out: Redis counts one lease per request,
// whatever its cost, and zones give it no cost.)
func TestHugeCost(t *testing.T) {
	huge := []int64{math.MaxInt64, 1<<53 + 1, bucket.MaxCost + 1, 1 << 62}
	for _, a := range []Algorithm{TokenBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter, LeakyBucket, Quota} {
		p := withCalendar(Policy{Algorithm: a, Rate: 5, Period: time.Second, Burst: 5, NoDelay: true})
		for name, newStore := range testStores {
			t.Run(a.String()+"/"+name, func(t *testing.T) {
				take := newStore(t)
				req := func(id string, cost int64) []Request {
					return []Request{{Zone: "z", Key: "k", Policy: p, Cost: cost, ID: id}}
				}
				if d, err := take(t0, req("first", 1)); err != nil || !d[0].Allowed || d[0].Remaining != p.Limit()-1 {
					t.Fatalf("first request: %+v, %v", d, err)
				}
				for _, cost := range huge {
					d, err := take(t0, req(fmt.Sprint("huge-", cost), cost))
					if err != nil || d[0].Allowed || d[0].Remaining != p.Limit()-1 || d[0].RetryAfter <= 0 {
						t.Fatalf("cost %d: %+v, %v; want refused, %d remaining", cost, d, err, p.Limit()-1)
					}
				}
				if d, err := take(t0, req("last", 1)); err != nil || !d[0].Allowed || d[0].Remaining != p.Limit()-2 {
					t.Fatalf("after the huge costs: %+v, %v; want allowed, %d remaining", d, err, p.Limit()-2)
				}
			})
		}
	}
}

// TestConcurrencyReset: an admin reset while requests hold slots starts
// the bucket afresh, and the releases of the slots taken before it free
// none of those taken after it (memory as Redis, whose leases are named).
func TestConcurrencyReset(t *testing.T) {
	p := Policy{Algorithm: Concurrency, Slots: 2, Lease: time.Minute}
	req := func(id string) []Request { return []Request{{Zone: "z", Key: "k", Policy: p, Cost: 1, ID: id}} }
	for name, newStore := range concurrencyStores {
		t.Run(name, func(t *testing.T) {
			take, s := newStore(t)
			ctx := context.Background()
			now := time.Now()
			steps := []struct {
				id      string
				allowed bool
			}{{"A", true}, {"B", true}, {"reset", false}, {"C", true}, {"D", true}, {"release", false}, {"E", false}}
			for _, st := range steps {
				switch st.id {
				case "reset":
					if err := s.Reset(ctx, req("")[0]); err != nil {
						t.Fatal(err)
					}
				case "release":
					if err := s.Release(ctx, append(req("A"), req("B")...)); err != nil {
						t.Fatal(err)
					}
				default:
					d, err := take(now, req(st.id))
					if err != nil || d[0].Allowed != st.allowed {
						t.Fatalf("request %s: %+v, %v; want allowed %v", st.id, d, err, st.allowed)
					}
				}
			}
		})
	}
}

// withCalendar is p, a quota's with a calendar: a day in UTC.
func withCalendar(p Policy) Policy {
	if p.Algorithm == Quota {
		p.Calendar, p.Period = bucket.Calendar{Unit: bucket.Day}, bucket.Day.Nominal()
	}
	return p
}
