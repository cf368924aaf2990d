package ratelimit

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// What a refusal tells the world besides its response: the placeholder
// {http.rate_limit.exceeded.name}, the rate_limit_exceeded event
// (events.go), and with log_refusals an info line for fail2ban and
// CrowdSec, throttled per client and zone.

// RefusalLog configures the info-level log of refused requests.
type RefusalLog struct {
	// Interval is the shortest time between two lines about the same
	// client address in the same zone; the refusals between them are not
	// logged. Default: 1m.
	Interval caddy.Duration `json:"interval,omitempty"`

	// Off logs no info line for refusals, not even caddy-ratelimit's
	// (see Handler.LogRefusals); they stay in the debug log.
	Off bool `json:"off,omitempty"`
}

const (
	// defaultRefusalLogInterval is RefusalLog.Interval's default.
	defaultRefusalLogInterval = time.Minute
	// refusalLogClients bounds the clients remembered: twice this many
	// digests at most (the current generation and the previous one).
	refusalLogClients = 10000
)

// provisionRefusals sets up what a refusal emits: the event (when
// Caddy's events app runs) and the info log (with LogRefusals).
func (h *Handler) provisionRefusals(ctx caddy.Context) error {
	if err := h.provisionEvents(ctx); err != nil {
		return err
	}
	var every time.Duration
	if h.LogRefusals != nil {
		if every = time.Duration(h.LogRefusals.Interval); every < 0 {
			return fmt.Errorf("log_refusals: interval %s: want a positive duration", every)
		}
		if !h.LogRefusals.Off {
			h.refusals = newRefusalThrottle(cmp.Or(every, defaultRefusalLogInterval), refusalLogClients)
		}
	}
	dry := h.DryRun
	for _, z := range h.Zones {
		dry = dry || z != nil && z.DryRun
	}
	if dry {
		h.dryRefusals = newRefusalThrottle(cmp.Or(every, defaultRefusalLogInterval), refusalLogClients)
	}
	return nil
}

// reportDryRun logs at info level the refusals that the dry-run zones of
// v would have made, at most one line per client (grouped as the zone
// groups addresses) and zone per log_refusals' interval (default 1m).
func (h *Handler) reportDryRun(r *http.Request, zones []*Zone, v *limiter.Verdict) {
	client := ""
	for i, s := range v.States {
		if s != limiter.WouldRefuse {
			continue
		}
		if client == "" {
			_, client = clientAddresses(r)
		}
		z := zones[i]
		if h.dryRefusals.allow(z.name, z.subnet(client), h.now().UnixNano()) {
			h.logger.Info("dry run: would be rate limited", zap.String("zone", z.name), zap.String("client_ip", client),
				zap.Int64("retry_after", v.Decisions[i].RetryAfterSeconds()))
		}
	}
}

// reportBans logs at info level each ban that v started: the zone, the
// client's address as log_refusals writes it, and how long the ban lasts
// (its configured length; the key only with LogKeys). A client is banned once per ban, so the
// lines need no throttle.
func (h *Handler) reportBans(r *http.Request, zones []*Zone, v *limiter.Verdict) {
	for i, s := range v.States {
		if s != limiter.BanStarted {
			continue
		}
		remote, client := clientAddresses(r)
		fields := []zap.Field{zap.String("zone", zones[i].name), zap.String("client_ip", client), zap.String("remote_ip", remote),
			zap.Duration("for", v.Requests[i].Policy.Ban.For)}
		if h.LogKeys {
			fields = append(fields, zap.String("key", v.Requests[i].Key))
		}
		h.logger.Info("client banned", fields...)
	}
}

// reportRefusal is called once for each request refused: it logs it at
// debug level, sets {http.rate_limit.exceeded.name} (caddy-ratelimit's
// placeholder), emits rate_limit_exceeded when something can observe it,
// and writes the info line of LogRefusals. Without either, it costs one
// placeholder.
func (h *Handler) reportRefusal(r *http.Request, repl *caddy.Replacer, o outcome) {
	if ce := h.logger.Check(zap.DebugLevel, "rate limited"); ce != nil {
		zf := []zap.Field{zap.String("zone", o.zone), zap.Int64("retry_after", o.retry)}
		if h.LogKeys {
			zf = append(zf, zap.String("key", o.req.Key))
		}
		ce.Write(zf...)
	}
	repl.Set("http.rate_limit.exceeded.name", o.z.shown.name) // o.zone, boxed once
	emit := h.events != nil && h.events.ShouldEmit(exceededEvent)
	if !emit && h.refusals == nil {
		return
	}
	remote, client := clientAddresses(r)
	if emit {
		h.emitExceeded(o, remote, client)
	}
	// A client is throttled as the zone groups addresses: an IPv6 /64 is one.
	if h.refusals != nil && h.refusals.allow(o.zone, o.z.subnet(client), h.now().UnixNano()) {
		h.logRefusalInfo(r, o, remote, client)
	}
}

// logRefusalInfo writes LogRefusals' line: caddy-ratelimit's message
// and fields (zone, wait, remote_ip, and key with LogKeys), with the
// client address first so that a filter can match it right after the
// zone (see the fail2ban filter in docs/operations.md).
func (h *Handler) logRefusalInfo(r *http.Request, o outcome, remote, client string) {
	if h.compatLog { // caddy-ratelimit's line, field for field
		fields := []zap.Field{zap.String("zone", o.zone), zap.Duration("wait", o.d.RetryAfter), zap.String("remote_ip", remote)}
		if h.LogKeys {
			fields = append(fields, zap.String("key", o.req.Key))
		}
		h.logger.Info("rate limit exceeded", fields...)
		return
	}
	fields := []zap.Field{zap.String("zone", o.zone), zap.String("client_ip", client), zap.String("remote_ip", remote),
		zap.String("host", r.Host), zap.String("method", r.Method), zap.String("path", r.URL.Path),
		zap.Int64("retry_after", o.retry), zap.Duration("wait", o.d.RetryAfter)}
	if h.LogKeys {
		fields = append(fields, zap.String("key", o.req.Key))
	}
	h.logger.Info("rate limit exceeded", fields...)
}

// clientAddresses are the request's peer address (caddy-ratelimit's
// remote_ip) and its client address as Caddy sees it ({client_ip}: the
// address a trusted proxy reports, else the peer's).
func clientAddresses(r *http.Request) (remote, client string) {
	remote, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		remote = r.RemoteAddr
	}
	client, _ = caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	if client == "" {
		client = remote
	}
	return remote, client
}

// refusalThrottle remembers, for a while, which client and zone pairs
// were logged: a digest of each (never the address itself), in two
// generations of at most limit entries, the older dropped when the newer
// is full or older than the interval. A flood of distinct clients
// therefore costs bounded memory, at the price of a client logged twice
// within an interval when more than limit clients are refused in it.
type refusalThrottle struct {
	every     int64 // the interval, ns
	limit     int   // digests per generation
	seed      maphash.Seed
	mu        sync.Mutex
	cur, prev map[uint64]int64 // digest → when last logged, Unix ns
	rotated   int64            // when cur started, Unix ns
}

func newRefusalThrottle(every time.Duration, limit int) *refusalThrottle {
	return &refusalThrottle{every: int64(every), limit: limit, seed: maphash.MakeSeed(), cur: make(map[uint64]int64)}
}

// allow reports whether a line about client in zone may be written at
// now, and if so remembers it.
func (t *refusalThrottle) allow(zone, client string, now int64) bool {
	var d maphash.Hash
	d.SetSeed(t.seed)
	d.WriteString(zone)
	d.WriteByte(0)
	d.WriteString(client)
	k := d.Sum64()
	t.mu.Lock()
	defer t.mu.Unlock()
	last, seen := t.cur[k]
	if !seen {
		last, seen = t.prev[k]
	}
	if seen && now-last < t.every {
		return false
	}
	if len(t.cur) >= t.limit || now-t.rotated >= t.every {
		t.prev, t.cur, t.rotated = t.cur, make(map[uint64]int64, len(t.cur)), now
	}
	t.cur[k] = now
	return true
}
