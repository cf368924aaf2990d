package redistest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Client sends a test's own commands to a Redis server: to look at what
// the code under test wrote, or to change the server under it. It
// announces nothing on connecting (no CLIENT SETINFO, which Redis before
// 7.2 counts as an error), waits as long as a command takes, and tries
// nothing twice.
type Client struct{ c *redis.Client }

// Dial is a Client of the server at addr, closed when t ends.
func Dial(t testing.TB, addr string) *Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: -1, MaxRetries: -1, DisableIdentity: true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { c.Close() })
	return &Client{c}
}

// Do sends a command and returns its reply.
func (c *Client) Do(ctx context.Context, args ...any) (any, error) {
	return c.c.Do(ctx, args...).Result()
}

// Int sends a command whose reply is an integer; 0 on an error.
func (c *Client) Int(ctx context.Context, args ...any) int64 {
	n, _ := c.c.Do(ctx, args...).Int64()
	return n
}

// Text sends a command whose reply is a string; "" on an error.
func (c *Client) Text(ctx context.Context, args ...any) string {
	s, _ := c.c.Do(ctx, args...).Text()
	return s
}
