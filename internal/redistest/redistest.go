// Package redistest runs real redis-server processes on loopback for tests:
// standalone servers and clusters, each stopped by its PID.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process.
type Server struct {
	Port int
	Addr string

	dir  string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	up   time.Time // see Up
}

// freePorts finds a port p such that p and p+10000 (a cluster node's bus
// port) are both free on 127.0.0.1.
func freePorts() (int, error) {
	for range 200 {
		p := 20000 + rand.IntN(10000)
		if free(p) && free(p+10000) {
			return p, nil
		}
	}
	return 0, errors.New("no free port pair found")
}

func free(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// StartServer starts redis-server on a free loopback port, with its files
// in a new directory under dir and extra configuration arguments, and waits
// until it answers PING.
func StartServer(dir string, extra ...string) (*Server, error) {
	port, err := freePorts()
	if err != nil {
		return nil, err
	}
	s := &Server{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), dir: filepath.Join(dir, strconv.Itoa(port))}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, err
	}
	s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--logfile", filepath.Join(s.dir, "redis.log")}, extra...)
	return s, s.Start()
}

// Start starts the server (again, after Stop or Kill) on the same port.
func (s *Server) Start() error {
	s.cmd = exec.Command("redis-server", s.args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	s.done = done
	go func() { _ = s.cmd.Wait(); close(done) }()
	return s.waitPing()
}

func (s *Server) waitPing() error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server on %s exited:\n%s", s.Addr, log)
		default:
		}
		sent := time.Now()
		if c.Ping(context.Background()).Err() == nil {
			s.up = sent
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("redis-server on %s did not answer within 10s", s.Addr)
}

// Up is when the server last came back, to within the 20ms between
// PINGs: when the first PING it answered after its last Start was sent (a
// server still starting up holds it; Start returns after the answer).
func (s *Server) Up() time.Time { return s.up }

// Stop ends the server with SIGTERM (SIGKILL after 5s) and waits for it.
func (s *Server) Stop() { s.signal(syscall.SIGTERM) }

// Kill ends the server with SIGKILL, as a crash would, and waits for it.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

func (s *Server) signal(sig syscall.Signal) {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = syscall.Kill(s.cmd.Process.Pid, sig)
	_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}

// Pause stops the server with SIGSTOP: it keeps accepting connections (the
// kernel does) but answers nothing, like a hung or overloaded server.
func (s *Server) Pause() { _ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGSTOP) }

// Resume continues a paused server.
func (s *Server) Resume() { _ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT) }

// Cluster is a Redis Cluster of masters, each with replicas.
type Cluster struct {
	Servers []*Server
}

// Addrs are the addresses of every node.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		addrs[i] = s.Addr
	}
	return addrs
}

// Server is the node at addr, or nil.
func (c *Cluster) Server(addr string) *Server {
	for _, s := range c.Servers {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// StartCluster starts masters*(1+replicas) cluster nodes under dir, joins
// them with redis-cli --cluster create, and waits until every node reports
// the cluster ok with all slots covered. extra are more redis-server
// arguments for every node.
func StartCluster(dir string, masters, replicas int, extra ...string) (*Cluster, error) {
	c := &Cluster{}
	for range masters * (1 + replicas) {
		args := append([]string{"--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
			"--cluster-config-file", "nodes.conf", "--repl-diskless-sync-delay", "0",
			"--cluster-replica-validity-factor", "0"}, extra...)
		s, err := StartServer(dir, args...)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Servers = append(c.Servers, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitOK(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// WaitOK waits until every running node reports cluster_state:ok with all
// 16384 slots served, and every replica is in sync with its master.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if c.ok() {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("cluster not ok within %s", timeout)
}

func (c *Cluster) ok() bool {
	for _, s := range c.Servers {
		select {
		case <-s.done:
			continue // a stopped node
		default:
		}
		cl := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		info, err := cl.ClusterInfo(context.Background()).Result()
		repl, err2 := cl.Info(context.Background(), "replication").Result()
		cl.Close()
		if err != nil || err2 != nil || !strings.Contains(info, "cluster_state:ok") ||
			!strings.Contains(info, "cluster_slots_ok:16384") {
			return false
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return false
		}
	}
	return true
}

// Stop stops every node.
func (c *Cluster) Stop() {
	for _, s := range c.Servers {
		s.Stop()
	}
}
