package latencyproxy

import (
	"io"
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/redistest"
)

// TestRedisPingCostsTwoDelays sends PING to a real redis-server through the
// proxy (skipped when redis-server is not installed, unless
// RL_REQUIRE_REDIS=1).
func TestRedisPingCostsTwoDelays(t *testing.T) {
	const delay = 80 * time.Millisecond
	p := startProxy(t, redistest.StandaloneAddr(t), delay)
	c := dial(t, p.Addr())
	for i := range 2 {
		start := time.Now()
		if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(ioDeadline))
		reply := make([]byte, len("+PONG\r\n"))
		if _, err := io.ReadFull(c, reply); err != nil {
			t.Fatal(err)
		}
		rtt := time.Since(start)
		if string(reply) != "+PONG\r\n" {
			t.Fatalf("PING replied %q", reply)
		}
		t.Logf("PING %d through delay %v: %v", i, delay, rtt)
		if rtt < 2*delay || rtt >= slack {
			t.Fatalf("PING took %v, want at least %v and under %v", rtt, 2*delay, slack)
		}
	}
}
