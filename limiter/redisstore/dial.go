package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Options say how to reach a Redis: a standalone server, a Redis Cluster
// (several addresses, or Cluster), or a master through Sentinel
// (MasterName), and where the limiter's keys live in it.
type Options struct {
	// Addresses are host:port of the server, the cluster's nodes (seeds),
	// or the Sentinels.
	Addresses []string
	// Cluster treats a single address as a cluster's seed.
	Cluster bool
	// MasterName is the master Sentinel monitors; with it, Addresses are
	// the Sentinels.
	MasterName string
	// Username and Password authenticate (ACL or requirepass).
	Username, Password string
	// DB is the database number (standalone and Sentinel only).
	DB int
	// TLS, when set, connects with TLS.
	TLS *tls.Config
	// PoolSize is the largest number of connections per node; 0: 10 per
	// CPU.
	PoolSize int
	// Timeout bounds every wait: a command and its reply, a connection
	// from the pool; a dial waits at least a second.
	Timeout time.Duration
	// KeyPrefix starts every key; DefaultKeyPrefix when empty.
	KeyPrefix string
	// Dialer, when set, opens the connections (tests put a proxy between
	// a store and its Redis); nil: TCP.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Dial is a client of the Redis o names: nothing is sent before its first
// call. No call is retried (a script that may have run is not sent again),
// and a refused connection fails its call at once.
func Dial(o Options) Client {
	t := o.Timeout
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 o.Addresses,
		IsClusterMode:         o.Cluster,
		MasterName:            o.MasterName,
		Username:              o.Username,
		Password:              o.Password,
		DB:                    o.DB,
		TLSConfig:             o.TLS,
		PoolSize:              o.PoolSize,
		Dialer:                o.Dialer,
		DialTimeout:           max(t, time.Second),
		ReadTimeout:           t,
		WriteTimeout:          t,
		PoolTimeout:           t,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1, // a script that may have run is not sent again
		// One dial per call: a refused connection fails the call at once,
		// with its own error, not a timeout after dials tried again.
		DialerRetries: 1,
		// No CLIENT SETINFO nor CLIENT MAINT_NOTIFICATIONS on connecting:
		// Redis before 7.2 (and any but Redis Enterprise, for the second)
		// answers them with an error, which its errorstats count (noise
		// under an alert on Redis's errors).
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// Open is a Store on the Redis o names (see Dial and New).
func Open(o Options) (*Store, error) {
	client := Dial(o)
	s, err := New(client, o.KeyPrefix)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return s, nil
}

// SetLogger routes go-redis's own log lines (failed dials and the like)
// to log: the limiter reports failures itself, once.
func SetLogger(log func(msg string)) { redis.SetLogger(logger(log)) }

type logger func(msg string)

func (l logger) Printf(_ context.Context, format string, v ...any) { l(fmt.Sprintf(format, v...)) }

// ReplyCode is the code of a Redis error reply in err (such as NOSCRIPT
// or OOM), and whether err is one: Redis answered, with an error.
func ReplyCode(err error) (string, bool) {
	var reply redis.Error
	if !errors.As(err, &reply) || errors.Is(err, redis.ErrClosed) {
		return "", false
	}
	code, _, _ := strings.Cut(reply.Error(), " ")
	return code, true
}
