package ratelimit

import (
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
)

// exceededEvent is the event emitted for each refused request, under
// caddy-ratelimit's name, so that its exec and webhook subscriptions
// keep working.
const exceededEvent = "rate_limit_exceeded"

// provisionEvents finds Caddy's events app, which the HTTP app always
// loads; without one (a handler provisioned outside Caddy's HTTP app, as
// in unit tests) no event is emitted.
func (h *Handler) provisionEvents(ctx caddy.Context) error {
	app, err := ctx.AppIfConfigured("events")
	switch {
	case errors.Is(err, caddy.ErrNotConfigured):
		return nil
	case err != nil:
		return fmt.Errorf("events app: %w", err)
	}
	h.events, h.eventCtx = app.(*caddyevents.App), ctx
	return nil
}

// emitExceeded emits rate_limit_exceeded for a refusal, with
// caddy-ratelimit's data (zone, wait, remote_ip) and ours (client_ip,
// retry_after in seconds as in Retry-After). The caller checks that
// something can observe it (ShouldEmit: a subscription, or the events
// app's debug log). Handlers run synchronously, before the response, as
// in caddy-ratelimit.
func (h *Handler) emitExceeded(o outcome, remote, client string) {
	h.events.Emit(h.eventCtx, exceededEvent, map[string]any{
		"zone":        o.zone,
		"wait":        o.d.RetryAfter,
		"remote_ip":   remote,
		"client_ip":   client,
		"retry_after": o.retry,
	})
}
