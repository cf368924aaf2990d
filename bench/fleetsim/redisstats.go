package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// processCPU is the CPU time this process spent (user and system, every
// thread) so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// node is a Redis server of the run: a standalone server, or a Cluster
// node, master or replica.
type node struct {
	addr   string
	master bool
	c      *redis.Client
}

// redisNodes are every node of the run's regions.
type redisNodes []node

// redisSample is what INFO and DBSIZE tell of the nodes at one time.
type redisSample struct {
	cpu  time.Duration // used_cpu_sys + used_cpu_user, every node
	mem  int64         // used_memory - mem_clients_normal - mem_clients_slaves, masters
	keys int64         // DBSIZE, masters
}

// discover finds every node of regs: a standalone server's address, a
// Cluster's nodes by CLUSTER NODES from its first seed that answers.
func discover(ctx context.Context, regs []region) (redisNodes, error) {
	var ns redisNodes
	for _, r := range regs {
		if !r.cluster {
			ns = append(ns, node{addr: r.addrs[0], master: true, c: newClient(r.addrs[0])})
			continue
		}
		found, err := clusterNodes(ctx, r.addrs)
		if err != nil {
			ns.close()
			return nil, fmt.Errorf("region %s: %w", r.name, err)
		}
		ns = append(ns, found...)
	}
	return ns, nil
}

// clusterNodes are the nodes of the Cluster of seeds, as the first seed
// that answers CLUSTER NODES tells them.
func clusterNodes(ctx context.Context, seeds []string) (redisNodes, error) {
	var errs []error
	for _, s := range seeds {
		c := newClient(s)
		text, err := c.ClusterNodes(ctx).Result()
		_ = c.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s, err))
			continue
		}
		var ns redisNodes
		for _, n := range parseClusterNodes(text) {
			n.c = newClient(n.addr)
			ns = append(ns, n)
		}
		return ns, nil
	}
	return nil, fmt.Errorf("cluster nodes: %w", errors.Join(errs...))
}

// parseClusterNodes reads CLUSTER NODES: each line's address (without
// its bus port and hostname) and whether it is a master; a node that
// failed or has no address is left out.
func parseClusterNodes(text string) redisNodes {
	var ns redisNodes
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		addr, _, _ = strings.Cut(addr, ",")
		flags := "," + f[2] + ","
		if addr == "" || strings.HasPrefix(addr, ":") || strings.Contains(flags, ",fail,") ||
			strings.Contains(flags, ",noaddr,") || strings.Contains(flags, ",handshake,") {
			continue
		}
		ns = append(ns, node{addr: addr, master: strings.Contains(flags, ",master,")})
	}
	return ns
}

// newClient is a client of one node, for INFO, DBSIZE and the cleanup.
func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true, PoolSize: 2})
}

// sample reads INFO cpu and memory of every node, DBSIZE of the masters.
func (ns redisNodes) sample(ctx context.Context) (redisSample, error) {
	var s redisSample
	for _, n := range ns {
		text, err := n.c.Info(ctx, "cpu", "memory").Result()
		if err != nil {
			return s, fmt.Errorf("INFO of %s: %w", n.addr, err)
		}
		info := parseInfo(text)
		s.cpu += time.Duration((info.float("used_cpu_sys") + info.float("used_cpu_user")) * float64(time.Second))
		if !n.master {
			continue
		}
		s.mem += int64(info.float("used_memory") - info.float("mem_clients_normal") - info.float("mem_clients_slaves"))
		keys, err := n.c.DBSize(ctx).Result()
		if err != nil {
			return s, fmt.Errorf("DBSIZE of %s: %w", n.addr, err)
		}
		s.keys += keys
	}
	return s, nil
}

// idle is the nodes' CPU per second over d, before the fleet is made
// (their cron, a Cluster's bus: what a figure per decision divides too,
// which weighs at a low load), and the sample at its end.
func (ns redisNodes) idle(ctx context.Context, d time.Duration) (time.Duration, redisSample, error) {
	s0, err := ns.sample(ctx)
	if err != nil {
		return 0, s0, err
	}
	t0 := time.Now()
	time.Sleep(d)
	s1, err := ns.sample(ctx)
	return time.Duration(float64(s1.cpu-s0.cpu) / time.Since(t0).Seconds()), s1, err
}

// watch samples the nodes every period until the returned function is
// called, which returns the sample of the most keys, and the first error.
func (ns redisNodes) watch(ctx context.Context, period time.Duration) func() (redisSample, error) {
	done, out := make(chan struct{}), make(chan redisSample, 1)
	var err error
	go func() {
		var peak redisSample
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				out <- peak
				return
			case <-t.C:
			}
			s, e := ns.sample(ctx)
			if e != nil {
				err = cmp.Or(err, e)
			} else if s.keys >= peak.keys {
				peak = s
			}
		}
	}()
	return func() (redisSample, error) {
		close(done)
		peak := <-out
		return peak, err
	}
}

// info is INFO's fields by name.
type info map[string]string

// parseInfo reads INFO's "name:value" lines.
func parseInfo(text string) info {
	m := info{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			m[k] = v
		}
	}
	return m
}

// float is field name as a number, 0 when absent.
func (m info) float(name string) float64 {
	f, _ := strconv.ParseFloat(m[name], 64)
	return f
}

// cleanup deletes the keys that start with prefix from every master, and
// counts them.
func (ns redisNodes) cleanup(ctx context.Context, prefix string) (int, error) {
	n := 0
	for _, nd := range ns {
		if !nd.master {
			continue
		}
		it := nd.c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		pipe := nd.c.Pipeline()
		for it.Next(ctx) {
			pipe.Unlink(ctx, it.Val()) // one key a command: a Cluster node's keys are of many slots
			if n++; pipe.Len() >= 1000 {
				if _, err := pipe.Exec(ctx); err != nil {
					return n, fmt.Errorf("UNLINK on %s: %w", nd.addr, err)
				}
			}
		}
		if err := it.Err(); err != nil {
			return n, fmt.Errorf("SCAN of %s: %w", nd.addr, err)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return n, fmt.Errorf("UNLINK on %s: %w", nd.addr, err)
		}
	}
	return n, nil
}

// memoryUsage is the mean MEMORY USAGE of up to n keys that start with
// prefix, over the masters (a key's own bytes: its name, value and
// expiry, as Redis counts them), and how many it read.
func (ns redisNodes) memoryUsage(ctx context.Context, prefix string, n int) (float64, int, error) {
	var sum, read int64
	for _, nd := range ns {
		if !nd.master {
			continue
		}
		keys, _, err := nd.c.Scan(ctx, 0, prefix+"*", int64(n)).Result()
		if err != nil {
			return 0, 0, fmt.Errorf("SCAN of %s: %w", nd.addr, err)
		}
		for _, k := range keys {
			b, err := nd.c.MemoryUsage(ctx, k, 0).Result()
			if errors.Is(err, redis.Nil) {
				continue // expired since
			}
			if err != nil {
				return 0, 0, fmt.Errorf("MEMORY USAGE on %s: %w", nd.addr, err)
			}
			sum, read = sum+b, read+1
		}
	}
	return float64(sum) / float64(max(read, 1)), int(read), nil
}

// close closes the nodes' clients.
func (ns redisNodes) close() {
	for _, n := range ns {
		_ = n.c.Close()
	}
}
