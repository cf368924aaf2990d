package regions

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// periodPeer is a peer's Redis whose clock is in the period that ends at
// end: its charges of a quota of another period do nothing, and its
// replies say when its period ends (quota.lua).
type periodPeer struct {
	end     time.Time
	charged []bucket.Request
}

func (p *periodPeer) ChargeAll(_ context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	p.charged = append(p.charged, reqs...)
	ds := make([]bucket.Decision, len(reqs))
	for i := range ds {
		ds[i] = bucket.Decision{Allowed: true, At: p.end.Add(-time.Second), Reset: p.end}
	}
	return ds, nil
}

func (p *periodPeer) Groups(_ context.Context, reqs []bucket.Request) [][]int {
	all := make([]int, len(reqs))
	for i := range all {
		all[i] = i
	}
	return [][]int{all}
}

func (*periodPeer) MarkRegion(context.Context, string, string, time.Duration) error { return nil }
func (*periodPeer) Ban(context.Context, bucket.Request, time.Duration) error        { return nil }
func (*periodPeer) Prepare(context.Context) error                                   { return nil }
func (*periodPeer) Ping(context.Context) error                                      { return nil }

// TestChargeOfLaterPeriodKept: a quota's charge of a period the peer's
// clock has not reached yet (this region's Redis ahead of the peer's
// near midnight) counts nothing there: it stays in doubt, and is charged
// again once the peer's period is the charge's, not dropped as charged.
func TestChargeOfLaterPeriodKept(t *testing.T) {
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	peer := &periodPeer{end: day}
	x := New(Config{This: "eu", Peers: map[string]Peer{"us": peer}, Interval: time.Second, Timeout: time.Second})
	p := bucket.Policy{Algorithm: bucket.Quota, Rate: 100, Burst: 100, Period: bucket.Day.Nominal(), Calendar: bucket.Calendar{Unit: bucket.Day}}
	r := bucket.Request{Zone: "q", Key: "a", Policy: p, Cost: 5, Global: true}
	x.RecordPeriod(&r, day.Add(24*time.Hour)) // admitted here in the next day
	s, id := x.peers[0], bucket.IDOf(r)
	s.backlog[id] = x.pending[id]
	s.x.now = func() time.Time { return day.Add(-time.Second) }
	reqs, all := s.take(day.Add(-time.Second), 1)
	if _, err := s.charge(context.Background(), reqs, all); err != nil {
		t.Fatal(err)
	}
	if d, ok := s.doubts[id]; !ok || d.total != 5 {
		t.Fatalf("after a charge of the next day to a peer still in this one: in doubt %v (%+v); want its 5 kept", ok, d)
	}
	peer.end = day.Add(24 * time.Hour) // the peer's clock turned
	reqs, all = s.take(day.Add(time.Second), 2)
	if _, err := s.charge(context.Background(), reqs, all); err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 1 || reqs[0].Cost != 5 || len(s.doubts) != 0 {
		t.Errorf("charged again %+v, in doubt %d; want the 5 once more, then none in doubt", reqs, len(s.doubts))
	}
}
