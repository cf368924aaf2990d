package regions

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Charges that run exactly once. A part of an exchange that fails may or
// may not have run (a time-out, a reset connection): each bucket it
// charged is then in doubt, and is charged again at the next exchanges,
// with what was admitted since, until a charge of it is known to have run.
// So that no charge runs twice, a sender charges a bucket by its total in
// an epoch (the exchange that first sent it, since the last charge that
// ran): the peer keeps, in the bucket's value after its time, each
// sender's total in its latest epoch, and charges only what a total adds
// to it (see charged_once in gcra.lua). Once a charge is known to have
// run, the bucket's epoch ends: its next charge starts another. A bucket
// is in doubt at most LinkTimeout (then the link is down, and its counts
// dropped as the backlog's are). The records live as long as the bucket:
// one that refilled meanwhile is deleted with them, and a send again
// then charges its whole total again, at most what it refilled.

// doubt is a bucket whose charges to the peer may not have run.
type doubt struct {
	p      *bucket.Policy // the policy it is charged with
	epoch  uint64         // the exchange that first sent them
	total  int64          // what this epoch's charges add up to
	since  time.Time      // when they were first sent
	again  bool           // sent before in this epoch: the peer may hold a record
	empty  int64          // the bucket's level, if it refused (count's)
	period int64          // a quota's: the end of the period its charges count in (count's)
}

// maxTotal bounds a bucket's total in an epoch: the scripts' largest cost.
const maxTotal = 1 << 40

// sent is a bucket charged in an exchange.
type sent struct {
	id bucket.ID
	d  doubt
}

// take empties the backlog, and the buckets in doubt, into requests to
// charge at now, in the exchange epoch. A bucket's new charge is at most
// twice what this instance can have admitted of it since the last take
// (its share of the burst and the refill meanwhile): what no decision
// here could have admitted is no one's to charge.
func (s *sender) take(now time.Time, epoch uint64) ([]bucket.Request, []sent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	elapsed := now.Sub(s.taken)
	if s.taken.IsZero() {
		elapsed = s.x.cfg.Interval
	}
	s.taken = now
	all := make([]sent, 0, len(s.backlog)+len(s.doubts))
	for id, c := range s.backlog {
		d, ok := s.doubts[id]
		if ok && c.period < d.period { // a quota's count of a period before the doubt's: none
			continue
		}
		if !ok || c.period > d.period { // a quota's new period: its own epoch (the doubt's period went)
			d = doubt{p: c.p, epoch: epoch, since: now, period: c.period}
		}
		d.total = min(d.total+min(c.cost, maxCharge(*c.p, s.x.regions, elapsed)), maxTotal)
		d.empty = max(d.empty, c.empty)
		delete(s.doubts, id)
		all = append(all, sent{id, d})
	}
	for id, d := range s.doubts {
		all = append(all, sent{id, d})
	}
	for i := range all {
		all[i].d.again = all[i].d.epoch != epoch
	}
	clear(s.backlog)
	clear(s.doubts)
	reqs := make([]bucket.Request, len(all))
	for i, a := range all {
		reqs[i] = bucket.RequestOf(a.id, *a.d.p)
		reqs[i].Cost = a.d.total
		reqs[i].ID = "n:" + s.x.id + ":" + strconv.FormatUint(a.d.epoch, 10)
		if a.d.again {
			reqs[i].ID = "o" + reqs[i].ID[1:]
		}
	}
	return reqs, all
}

// An exchange is paced so that the peer's Redis is never held long: the
// buckets go in parts of one node's, at most partKeys each (a script call
// of about 1.5 ms there), one part every partGap (so that the peer's
// other clients wait at most about one part's time, and the exchanges
// take at most about a third of the peer's time), at most partsInFlight
// at once, and no part starts once half the exchange's timeout has
// passed: the buckets not sent are charged at the next exchange (in
// doubt, by their totals), within LinkTimeout, else dropped and the
// instance floods (see flood.go). So an exchange tells a peer at most
// timeout / 2 / partGap × partKeys buckets: 16,000 with a timeout of 1 s.
const (
	partKeys      = 128
	partGap       = 4 * time.Millisecond
	partsInFlight = 64
)

// charge charges reqs to the peer, paced (see partKeys). The buckets of
// a part that failed, or was not sent, are in doubt; it returns the
// first failure and how many buckets were charged.
func (s *sender) charge(ctx context.Context, reqs []bucket.Request, all []sent) (int, error) {
	if len(reqs) == 0 {
		return 0, nil
	}
	start, budget := time.Now(), s.x.cfg.Timeout/2
	parts := splitParts(s.peer.Groups(ctx, reqs), partKeys)
	errs := make([]error, len(parts))
	slots := make(chan struct{}, partsInFlight)
	var wg sync.WaitGroup
	var charged, ran, took atomic.Int64
	for j, part := range parts {
		if wait := time.Until(start.Add(time.Duration(j) * partGap)); wait > 0 {
			time.Sleep(wait)
		}
		slots <- struct{}{}
		if time.Since(start) > budget { // the rest at the next exchange
			for _, rest := range parts[j:] {
				s.doubtful(all, rest)
			}
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			began := time.Now()
			ds, err := s.peer.ChargeAll(ctx, s.withLevels(reqs, all, part))
			if errs[j] = err; err != nil {
				s.doubtful(all, part)
			} else {
				s.doubtful(all, early(all, part, ds))
				charged.Add(int64(len(part)))
				ran.Add(1)
				took.Add(int64(time.Since(began)))
			}
		}()
	}
	wg.Wait()
	if n := ran.Load(); n > 0 {
		s.oneWay.Store(took.Load() / n / 2)
	}
	for _, err := range errs {
		if err != nil {
			return int(charged.Load()), err
		}
	}
	return int(charged.Load()), nil
}

// early is what of part, charged with replies ds, are a quota's charges
// of a period the peer's clock has not reached (its Redis behind this
// region's near a period's turn): the peer counted nothing of them (see
// charge_once in quota.lua), so they stay in doubt, charged again until
// the peer's period is theirs, within LinkTimeout.
func early(all []sent, part []int, ds []bucket.Decision) []int {
	var out []int
	for k, i := range part {
		d := all[i].d
		if d.period > 0 && d.p.Algorithm == bucket.Quota && k < len(ds) && !ds[k].Reset.IsZero() &&
			ds[k].Reset.UnixMicro() < d.period {
			out = append(out, i)
		}
	}
	return out
}

// withLevels is the requests of part, their ids ending in ":<level>" for
// the buckets that refused here (see Refused), and a quota's in
// "@<end>", the end of the period its charge counts in (µs). A token
// bucket's level is when it was empty, in µs from when the peer runs the
// charge (now, and half the last charges' round trip), unless it is full
// by then: the level a peer lifts its copy to is thus late by how much
// the way out is longer than the way back, and lifts only what differs by
// more. A quota's is its count.
func (s *sender) withLevels(reqs []bucket.Request, all []sent, part []int) []bucket.Request {
	picked := bucket.Pick(reqs, part)
	at := s.x.now().UnixNano() + s.oneWay.Load()
	for k, i := range part {
		d := all[i].d
		switch {
		case d.p.Algorithm == bucket.Quota:
			if d.empty > 0 {
				picked[k].ID += ":" + strconv.FormatInt(d.empty, 10)
			}
			if d.period > 0 {
				picked[k].ID += "@" + strconv.FormatInt(d.period, 10)
			}
		case d.empty != 0 && d.p.Rate > 0:
			rel := (d.empty - at) / 1000
			if full := int64(float64(d.p.Period.Microseconds()) / float64(d.p.Rate) * float64(d.p.Burst)); rel+full > 0 {
				picked[k].ID += ":" + strconv.FormatInt(rel, 10)
			}
		}
	}
	return picked
}

// splitParts cuts parts into parts of at most n.
func splitParts(parts [][]int, n int) [][]int {
	var out [][]int
	for _, p := range parts {
		for len(p) > n {
			out, p = append(out, p[:n]), p[n:]
		}
		out = append(out, p)
	}
	return out
}

// doubtful puts the buckets of part in doubt, for at most LinkTimeout
// from their first send: past it, they are dropped (and reported), and
// while the link is up (an exchange succeeded within LinkTimeout: the
// peer counts this region at the whole rate) the instance floods; a link
// down is counted at its share by the peer already.
func (s *sender) doubtful(all []sent, part []int) {
	oldest := s.x.now().Add(-LinkTimeout(s.x.cfg.Interval, s.x.cfg.Timeout))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, i := range part {
		if a := all[i]; a.d.since.After(oldest) {
			s.doubts[a.id] = a.d
		} else {
			s.dropped++
			if s.lastOK.After(oldest) { // not told in time, the link up: the peer must count this region at its share
				s.x.flooded()
			}
		}
	}
}

// maxCharge is twice what a bucket of policy p (its burst the region's
// share) admits in elapsed among regions, holding the whole burst (a
// quota's: its quota), at least 1.
func maxCharge(p bucket.Policy, regions int64, elapsed time.Duration) int64 {
	if p.Algorithm == bucket.Quota { // all of a period's quota at most
		return max(2*p.Rate, 1)
	}
	if p.Period <= 0 {
		return math.MaxInt64 / 2
	}
	refill := float64(p.Rate) * float64(max(elapsed, 0)) / float64(p.Period)
	return max(2*(p.Burst*regions+int64(min(refill, float64(math.MaxInt64/8)))), 1)
}

// merge adds c to the backlog's count of id; s.mu held.
func (s *sender) merge(id bucket.ID, c count) {
	b, ok := s.backlog[id]
	if !ok {
		s.backlog[id] = c
		return
	}
	s.backlog[id] = b.merged(c)
}
