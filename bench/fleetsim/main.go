package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"
)

func main() {
	c, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(2)
	}
	line, err := run(context.Background(), c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(1)
	}
	fmt.Println(line)
}

// logf tells the run's progress on stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "fleetsim: "+format+"\n", args...)
}

// result is what a run measured.
type result struct {
	setup, closing time.Duration
	w              window
	before         redisSample   // the nodes before the fleet was made
	idle           time.Duration // every node's CPU per second then, without the fleet
	acc            accuracy
	bound          float64
	gen            time.Duration // the generator's CPU per decision
	ev             *events
	fellBack       int64
	behind         int64
	lat            latencies // every decision's, warm-up included
}

// run makes c's fleet, runs its load, replays it, and returns the line.
func run(ctx context.Context, c config) (string, error) {
	if c.seed == 0 {
		c.seed = rand.Uint64()
	}
	prefix := fmt.Sprintf("fleetsim%08x:", rand.Uint32())
	nodes, err := discover(ctx, c.regions)
	if err != nil {
		return "", err
	}
	defer nodes.close()
	res := result{ev: &events{}}
	if res.idle, res.before, err = nodes.idle(ctx, time.Second); err != nil {
		return "", err
	}
	start := time.Now()
	f, err := newFleet(c, prefix, res.ev)
	if err != nil {
		return "", err
	}
	if err := f.warm(ctx, c); err != nil {
		return "", errors.Join(err, f.close())
	}
	res.setup, res.bound = time.Since(start), f.bound(c)
	logf("%d instances in %d regions (%d Redis nodes) ready in %s; load for %s", c.instances, len(c.regions),
		len(nodes), res.setup.Round(time.Millisecond), c.warmup+c.duration)
	ld := newLoad(c, f)
	ld.prefix = prefix
	w, recs, err := ld.measure(ctx, nodes)
	closing := time.Now()
	if err = errors.Join(err, f.close()); err != nil {
		return "", err
	}
	res.closing, res.w = time.Since(closing), w
	logf("redis masters: %d keys, %d bytes before; %d keys, %d bytes at the peak", res.before.keys, res.before.mem, w.peak.keys, w.peak.mem)
	res.fellBack, res.behind, res.lat = ld.fellBak.Load(), ld.behind.Load(), ld.lat
	res.acc = replay(recs, c.policy, ld.start, w.span, res.bound)
	res.gen = ld.generatorCost(min(c.duration, time.Second))
	if !c.keep {
		n, err := nodes.cleanup(ctx, prefix)
		if err != nil { // the line stands: the keys expire, but for the regions' records (10 minutes)
			logf("deleting the run's keys (%s*): %v", prefix, err)
		}
		logf("closed in %s; deleted %d keys of %s*", res.closing.Round(time.Millisecond), n, prefix)
	}
	return res.line(c), nil
}

// window is what the measured window of a load saw.
type window struct {
	decisions int64
	elapsed   time.Duration // the window's
	cpu       time.Duration // this process's CPU in it
	redisCPU  time.Duration // every node's in it
	peak      redisSample   // the nodes when they held the most keys (sampled every second, and at the end)
	usage     float64       // the mean MEMORY USAGE of a sample of the run's keys, at the end
	span      time.Duration // the whole load's, warm-up included
}

// measure runs the load for the warm-up, then for the window, and returns
// the window and every decision's record.
func (ld *load) measure(ctx context.Context, nodes redisNodes) (window, []uint64, error) {
	var w window
	stop := ld.run()
	peaks := nodes.watch(ctx, time.Second)
	time.Sleep(ld.c.warmup)
	r0, err := nodes.sample(ctx)
	if err != nil {
		stop()
		_, _ = peaks()
		return w, nil, err
	}
	t0, cpu0, d0 := time.Now(), processCPU(), ld.decided.Load()
	time.Sleep(ld.c.duration)
	w.decisions, w.elapsed, w.cpu = ld.decided.Load()-d0, time.Since(t0), processCPU()-cpu0
	end, err := nodes.sample(ctx)
	if err == nil {
		w.usage, _, err = nodes.memoryUsage(ctx, ld.prefix, 100)
	}
	recs := stop()
	w.span = time.Since(ld.start)
	peak, perr := peaks()
	if err = errors.Join(err, perr); err != nil {
		return w, nil, err
	}
	w.redisCPU, w.peak = end.cpu-r0.cpu, peak
	if end.keys >= peak.keys {
		w.peak = end
	}
	return w, recs, nil
}
