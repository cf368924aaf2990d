package redistest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Environment variables through which ./xcaddy.sh test hands the Redis it
// started to every test package.
const (
	EnvCluster    = "RL_REDIS_CLUSTER"    // comma-separated node addresses
	EnvStandalone = "RL_REDIS_STANDALONE" // one address
	EnvRequire    = "RL_REQUIRE_REDIS"    // "1": a missing Redis fails tests instead of skipping them
)

// needBinary skips (or, under RL_REQUIRE_REDIS=1, fails) a test when
// redis-server is not installed.
func needBinary(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err == nil {
		return
	}
	if os.Getenv(EnvRequire) == "1" {
		t.Fatal("redis-server is not installed, and RL_REQUIRE_REDIS=1")
	}
	t.Skip("redis-server is not installed; ./xcaddy.sh test installs it")
}

// NewServer starts a standalone redis-server owned by the test: stopped
// when the test ends, and free to stop, kill and restart within it.
func NewServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	needBinary(t)
	s, err := StartServer(t.TempDir(), extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// NewCluster starts a cluster owned by the test (3 masters, 1 replica each).
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	return NewClusterOf(t, 3, 1)
}

// NewClusterOf starts a cluster owned by the test, of masters with
// replicas each and extra redis-server arguments.
func NewClusterOf(t testing.TB, masters, replicas int, extra ...string) *Cluster {
	t.Helper()
	needBinary(t)
	c, err := StartCluster(t.TempDir(), masters, replicas, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// ClusterAddrs returns the addresses of the shared cluster that
// ./xcaddy.sh test started, or starts one for the test when run outside it.
// Tests must not stop its nodes; they use keys of their own.
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	if env := os.Getenv(EnvCluster); env != "" {
		return strings.Split(env, ",")
	}
	return NewCluster(t).Addrs()
}

// StandaloneAddr returns the address of the shared standalone Redis, or
// starts one for the test.
func StandaloneAddr(t testing.TB) string {
	t.Helper()
	if env := os.Getenv(EnvStandalone); env != "" {
		return env
	}
	return NewServer(t).Addr
}
