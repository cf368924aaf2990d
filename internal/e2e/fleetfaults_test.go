package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// Faults of the fleet scenario on a cluster the test owns (never the
// shared one, which other packages use meanwhile): a master restarted,
// and a failover to a replica. Each leaves the cluster with the masters it
// had before, serving every slot.

// role reads INFO replication of the node at addr: whether it is a
// master, and else the port of its master.
func role(t *testing.T, addr string) (master bool, masterPort string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	info, err := c.Info(t.Context(), "replication").Result()
	if err != nil {
		t.Fatalf("INFO replication of %s: %v", addr, err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "master_port:"); ok {
			masterPort = p
		}
	}
	return strings.Contains(info, "role:master"), masterPort
}

// masters are the nodes of cl that say they are masters now.
func masters(t *testing.T, cl *redistest.Cluster) []string {
	t.Helper()
	var ms []string
	for _, addr := range cl.Addrs() {
		if m, _ := role(t, addr); m {
			ms = append(ms, addr)
		}
	}
	return ms
}

// replicaOf is a replica of the master at addr.
func replicaOf(t *testing.T, cl *redistest.Cluster, addr string) string {
	t.Helper()
	for _, a := range cl.Addrs() {
		if m, port := role(t, a); !m && port == portOf(addr) {
			return a
		}
	}
	t.Fatalf("no replica of %s", addr)
	return ""
}

func portOf(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// failover makes the replica at addr its master's master, with CLUSTER
// FAILOVER (the old master's writes reach it first), and waits until the
// cluster serves every slot again. A manual failover that did not start
// within its 5s (the master had not yet learnt of this replica) is asked
// again.
func failover(t *testing.T, cl *redistest.Cluster, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	for attempt := 1; ; attempt++ {
		if err := c.Do(t.Context(), "CLUSTER", "FAILOVER").Err(); err != nil {
			t.Fatalf("CLUSTER FAILOVER on %s: %v", addr, err)
		}
		if becomesMaster(t, addr, 6*time.Second) {
			break
		}
		if attempt == 5 {
			t.Fatalf("%s is no master after %d CLUSTER FAILOVERs", addr, attempt)
		}
	}
	waitMastersAgree(t, cl)
}

// waitMastersAgree waits until the cluster serves every slot and its
// nodes agree on the masters: half its nodes, each with one replica, and
// each knowing its replica (a demoted master learns of the failover from
// the others' gossip, and a master that does not know its replica ignores
// its CLUSTER FAILOVER).
func waitMastersAgree(t *testing.T, cl *redistest.Cluster) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := cl.WaitOK(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		ms := masters(t, cl)
		if 2*len(ms) == len(cl.Servers) && knowReplicas(t, ms) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("masters %v: the nodes do not agree on the masters within 30s", ms)
		}
	}
}

// knowReplicas reports whether each master at addrs knows a replica of
// its own in its view of the cluster (CLUSTER REPLICAS).
func knowReplicas(t *testing.T, addrs []string) bool {
	t.Helper()
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
		id, err := c.Do(t.Context(), "CLUSTER", "MYID").Text()
		var replicas []any
		if err == nil {
			replicas, err = c.Do(t.Context(), "CLUSTER", "REPLICAS", id).Slice()
		}
		c.Close()
		if err != nil || len(replicas) == 0 {
			return false
		}
	}
	return true
}

// becomesMaster waits until the node at addr is a master, or within.
func becomesMaster(t *testing.T, addr string, within time.Duration) bool {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m, _ := role(t, addr); m {
			return true
		}
	}
	return false
}

// failoverAndBack fails the master at addr over to its replica, then back.
func failoverAndBack(t *testing.T, cl *redistest.Cluster, addr string) {
	t.Helper()
	failover(t, cl, replicaOf(t, cl, addr))
	failover(t, cl, addr)
}

// restartMaster kills the master at addr (SIGKILL, by its PID) and starts
// it again on the same port and files: without persistence it comes back
// empty, as a master that crashed and was restarted by its supervisor.
// Should its replica have taken over meanwhile, it is made master again.
func restartMaster(t *testing.T, cl *redistest.Cluster, addr string) {
	t.Helper()
	s := cl.Server(addr)
	s.Kill()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	waitMastersAgree(t, cl)
	if m, _ := role(t, addr); !m {
		failover(t, cl, addr)
	}
}
