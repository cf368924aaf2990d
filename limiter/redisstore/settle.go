package redisstore

import (
	"context"
	"strconv"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/bucket"
)

// Refund gives back on the server's clock what the takes of reqs, which
// decided taken, still hold back (see Store.Refund), in one round trip.
func (s *Store) Refund(ctx context.Context, reqs []bucket.Request, taken []bucket.Decision) ([]bucket.Decision, error) {
	return s.refundAt(ctx, "", reqs, taken)
}

// RefundAt is Refund at an explicit time instead of the server's clock.
func (s *Store) RefundAt(ctx context.Context, now time.Time, reqs []bucket.Request, taken []bucket.Decision) ([]bucket.Decision, error) {
	return s.refundAt(ctx, strconv.FormatInt(now.UnixMicro(), 10), reqs, taken)
}

// refundAt refunds reqs at now (Unix µs in decimal; "" for the server's
// clock). Each key's flag is its take's (see takenFlag).
func (s *Store) refundAt(ctx context.Context, now string, reqs []bucket.Request, taken []bucket.Decision) ([]bucket.Decision, error) {
	decisions := make([]bucket.Decision, len(reqs))
	var idx []int
	flags := make([]string, len(reqs))
	for i, r := range reqs {
		if r.Policy.Algorithm == bucket.Concurrency || r.Cost <= 0 || !taken[i].Allowed {
			continue
		}
		idx = append(idx, i)
		flags[i] = takenFlag(taken[i].At.UnixMicro(), taken[i].Reset.UnixMicro())
	}
	if len(idx) == 0 {
		return decisions, nil
	}
	return decisions, s.settle(ctx, now, modeRefund, reqs, idx, flags, decisions)
}

// takenFlag is the flag a key's script is given in refund mode, in place
// of the take's (the leaky bucket's nodelay, which a refund does not
// read): "<at>:<end>", the time of the take's decision and the end of its
// charge (the decision's Reset), in Unix µs. See taken in common.lua.
func takenFlag(at, end int64) string {
	return strconv.FormatInt(at, 10) + ":" + strconv.FormatInt(end, 10)
}

// Charge charges reqs on the server's clock (see Store.Charge).
func (s *Store) Charge(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	return s.charge(ctx, "", reqs)
}

// ChargeAt is Charge at an explicit time instead of the server's clock.
func (s *Store) ChargeAt(ctx context.Context, now time.Time, reqs []bucket.Request) ([]bucket.Decision, error) {
	return s.charge(ctx, strconv.FormatInt(now.UnixMicro(), 10), reqs)
}

func (s *Store) charge(ctx context.Context, now string, reqs []bucket.Request) ([]bucket.Decision, error) {
	decisions := make([]bucket.Decision, len(reqs))
	var idx []int
	for i, r := range reqs {
		if r.Policy.Algorithm.Debt() && r.Cost > 0 {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return decisions, nil
	}
	return decisions, s.settle(ctx, now, modeCharge, reqs, idx, nil, decisions)
}

// settle runs the scripts in mode (modeRefund, modeCharge) at now for the
// requests idx of reqs, with the flags of reqs (refunds; nil: the
// requests' own), and fills their decisions.
func (s *Store) settle(ctx context.Context, now string, mode scriptMode, reqs []bucket.Request, idx []int, flags []string, decisions []bucket.Decision) error {
	sub := make([]bucket.Request, len(idx))
	for j, i := range idx {
		sub[j] = reqs[i]
	}
	runs := s.scriptRuns(sub)
	if flags != nil {
		for r := range runs {
			runs[r].flags = make([]string, len(runs[r].idx))
			for j, i := range runs[r].idx {
				runs[r].flags[j] = flags[idx[i]]
			}
		}
	}
	if err := s.run(ctx, runs, now, mode, sub); err != nil {
		s.reloadTopology(err)
		return err
	}
	d := make([]bucket.Decision, len(sub))
	for i, sr := range runs {
		if _, err := decode(runs[i].reply, sr.idx, sub, d); err != nil {
			return err
		}
	}
	for j, i := range idx {
		decisions[i] = d[j]
	}
	return nil
}
