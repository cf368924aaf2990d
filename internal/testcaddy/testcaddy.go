// Package testcaddy runs a real Caddy binary with this module for end-to-end
// tests: it builds the binary once (unless CADDY_BIN names one), starts
// Caddy on loopback ports, reloads it through the admin API, and stops it
// by its PID when the test ends.
package testcaddy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary returns the path of the Caddy binary: $CADDY_BIN, or one built
// from internal/caddybin into a temporary directory, once per process.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv("CADDY_BIN"); p != "" {
			binPath, buildErr = filepath.Abs(p)
			return
		}
		binPath, buildErr = build()
	})
	if buildErr != nil {
		t.Fatalf("caddy binary: %v", buildErr)
	}
	return binPath
}

func build() (string, error) {
	dir, err := os.MkdirTemp("", "testcaddy")
	if err != nil {
		return "", err
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	out := filepath.Join(dir, "caddy")
	cmd := exec.Command("go", "build", "-o", out, "./internal/caddybin")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, msg)
	}
	return out, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Caddy is one running Caddy process.
type Caddy struct {
	// URL is the base URL of the site, http://127.0.0.1:<port>.
	URL string
	// Admin is the base URL of the admin API.
	Admin string
	// HTTPPort and AdminPort are the ports behind URL and Admin.
	HTTPPort, AdminPort int

	t    testing.TB
	cmd  *exec.Cmd
	dir  string
	logs *bytes.Buffer
	mu   *sync.Mutex
	done chan struct{}
}

// Start runs Caddy on a Caddyfile made from site: the site block's body,
// served at URL. Global options set the admin address and keep Caddy's
// files in a temporary directory. Extra global options may be given. A
// port that another process took between FreePort and Caddy's listen
// ("address already in use") is picked again, up to three times.
func Start(t testing.TB, site string, globals ...string) *Caddy {
	t.Helper()
	for attempt := 1; ; attempt++ {
		c := start(t, site, globals...)
		if !c.exitedInUse() || attempt == 3 {
			c.waitReady()
			return c
		}
	}
}

// exitedInUse waits until c listens or exits, and reports whether it
// exited because a port was taken.
func (c *Caddy) exitedInUse() bool {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case <-c.done:
			return strings.Contains(c.Logs(), "address already in use")
		default:
		}
		if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", c.HTTPPort), time.Second); err == nil {
			conn.Close()
			return false
		}
	}
	return false
}

// start starts Caddy on fresh ports, without waiting for it.
func start(t testing.TB, site string, globals ...string) *Caddy {
	t.Helper()
	c := &Caddy{t: t, dir: t.TempDir(), logs: new(bytes.Buffer), mu: new(sync.Mutex), done: make(chan struct{})}
	c.HTTPPort, c.AdminPort = FreePort(t), FreePort(t)
	c.URL = fmt.Sprintf("http://127.0.0.1:%d", c.HTTPPort)
	c.Admin = fmt.Sprintf("http://127.0.0.1:%d", c.AdminPort)
	file := filepath.Join(c.dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(c.Caddyfile(site, globals...)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(Binary(t), "run", "--config", file, "--adapter", "caddyfile")
	c.cmd.Env = append(os.Environ(), "HOME="+c.dir, "XDG_DATA_HOME="+c.dir, "XDG_CONFIG_HOME="+c.dir)
	c.cmd.Stdout, c.cmd.Stderr = c.logWriter(), c.logWriter()
	// Should the test binary die without cleaning up, Caddy dies too.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(c.Stop)
	return c
}

// Caddyfile is the whole Caddyfile that Start or Reload use for site.
func (c *Caddy) Caddyfile(site string, globals ...string) string {
	return fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tpersist_config off\n\tauto_https off\n\tdebug\n%s\n}\n\nhttp://127.0.0.1:%d {\n%s\n}\n",
		c.AdminPort, strings.Join(globals, "\n"), c.HTTPPort, site)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (c *Caddy) logWriter() io.Writer { return lockedWriter{c.mu, c.logs} }

// Logs returns what Caddy wrote so far.
func (c *Caddy) Logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logs.String()
}

// WaitLogs waits until Caddy's output holds substr (its lines reach the
// test through a pipe, a little after the response), and returns it all.
func (c *Caddy) WaitLogs(substr string) string {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		logs := c.Logs()
		if strings.Contains(logs, substr) || time.Now().After(deadline) {
			return logs
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady waits until the site answers, or fails the test.
func (c *Caddy) waitReady() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-c.done:
			c.t.Fatalf("caddy exited at start:\n%s", c.Logs())
		default:
		}
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", c.HTTPPort), time.Second)
		if err == nil {
			conn.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("caddy did not listen within 30s:\n%s", c.Logs())
}

// Reload loads a new site body through the admin API (POST /load).
func (c *Caddy) Reload(site string, globals ...string) error {
	req, err := http.NewRequest(http.MethodPost, c.Admin+"/load", strings.NewReader(c.Caddyfile(site, globals...)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	// A connection of its own: a kept-alive one the admin endpoint closes
	// as idle while the request goes out fails the POST with EOF, which
	// the client does not send again (not idempotent).
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reload: %s: %s", resp.Status, body)
	}
	return nil
}

// PID is the process ID of Caddy.
func (c *Caddy) PID() int { return c.cmd.Process.Pid }

// Stop ends Caddy: SIGTERM, then SIGKILL after 10 seconds. It fails the
// test if Caddy, built with the race detector, reported a data race.
func (c *Caddy) Stop() {
	select {
	case <-c.done:
	default:
		_ = syscall.Kill(c.PID(), syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(c.PID(), syscall.SIGKILL)
			<-c.done
		}
	}
	if logs := c.Logs(); strings.Contains(logs, "WARNING: DATA RACE") {
		c.t.Errorf("caddy reported a data race:\n%s", logs)
	}
}

// Get sends a GET to path with optional header pairs ("Name", "value"...).
func (c *Caddy) Get(path string, headers ...string) (*http.Response, string, error) {
	req, err := http.NewRequest(http.MethodGet, c.URL+path, nil)
	if err != nil {
		return nil, "", err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}
