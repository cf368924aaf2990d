package ratelimit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI is the admin endpoint of the rate limiter, at /rate_limit/ on
// Caddy's admin API:
//
//	GET    /rate_limit/zones                    the zones and their policies
//	POST   /rate_limit/zones/<zone>/lookup      a client's usage: limit, remaining, reset
//	POST   /rate_limit/zones/<zone>/reset       resets the client's bucket
//	GET    /rate_limit/zones/<zone>/keys/<key>  the same lookup, the key in the path
//	DELETE /rate_limit/zones/<zone>/keys/<key>  the same reset, the key in the path
//	GET    /rate_limit/zones/<zone>/usage       a quota's top keys this period, by digest
//
// The POST forms take the client key in a JSON body, {"key": "<key>"}, so
// that it stays out of the URI, which Caddy's admin.api logger writes at
// info level; the path forms are for keys that are no secret (addresses).
// The key is the client key as the zone's template resolves it (an IP
// address, an API key, a user id; URL-escaped in a path); IP addresses are
// grouped by the zone's prefixes. Zones whose rate comes from placeholders
// are shown with their default policy.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the admin routes.
func (AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/rate_limit/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// zoneRef is a zone of a running handler.
type zoneRef struct {
	h *Handler
	z *Zone
}

// registry holds the zones of the provisioned handlers; during a reload
// the new config's come last and win.
var registry = struct {
	sync.Mutex
	zones []zoneRef
}{}

func registerZones(h *Handler) {
	registry.Lock()
	defer registry.Unlock()
	for _, z := range h.zones {
		registry.zones = append(registry.zones, zoneRef{h, z})
	}
}

func unregisterZones(h *Handler) {
	registry.Lock()
	defer registry.Unlock()
	registry.zones = slices.DeleteFunc(registry.zones, func(r zoneRef) bool { return r.h == h })
}

// lookupZone is the zone named name of the newest config, if any.
func lookupZone(name string) (zoneRef, bool) {
	registry.Lock()
	defer registry.Unlock()
	for i := len(registry.zones) - 1; i >= 0; i-- {
		if registry.zones[i].z.name == name {
			return registry.zones[i], true
		}
	}
	return zoneRef{}, false
}

// zoneInfo describes a zone in GET /rate_limit/zones: its limit and
// policy in force, and, under an override of the zone, the override and
// the config's limit and policy.
type zoneInfo struct {
	Name            string          `json:"name"`
	Key             string          `json:"key"`
	Algorithm       string          `json:"algorithm"`
	Rate            string          `json:"rate,omitempty"`
	Limit           int64           `json:"limit"`
	MaxConcurrent   int64           `json:"max_concurrent,omitempty"`
	Policy          string          `json:"policy"`
	Store           string          `json:"store"`
	DryRun          bool            `json:"dry_run,omitempty"`
	Disabled        bool            `json:"disabled,omitempty"`
	ConfigLimit     int64           `json:"config_limit,omitempty"`
	ConfigPolicy    string          `json:"config_policy,omitempty"`
	Override        *overrideOutput `json:"override,omitempty"`
	OverrideLeftOut string          `json:"override_left_out,omitempty"`
}

func listZones() []zoneInfo {
	registry.Lock()
	defer registry.Unlock()
	byName := map[string]zoneInfo{}
	now := time.Now()
	for _, r := range registry.zones { // the newest config's last, so it wins
		byName[r.z.name] = zoneInfoOf(r, now) // admin_inforce.go
	}
	list := make([]zoneInfo, 0, len(byName))
	for _, info := range byName {
		list = append(list, info)
	}
	slices.SortFunc(list, func(a, b zoneInfo) int { return cmp.Compare(a.Name, b.Name) })
	return list
}

// usage is a client's usage in a zone, as a lookup answers it: the
// figures its next response's headers would show, under the limit in
// force for its key (Policy), and the overrides that make it.
type usage struct {
	Zone      string `json:"zone"`
	Key       string `json:"key"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	Reset     int64  `json:"reset"`
	Algorithm string `json:"algorithm"`
	Policy    string `json:"policy"`
	// ConfigLimit is the config's limit, when an override is in force.
	ConfigLimit  int64           `json:"config_limit,omitempty"`
	ZoneOverride *overrideOutput `json:"zone_override,omitempty"`
	KeyOverride  *overrideOutput `json:"key_override,omitempty"`
	Blocked      bool            `json:"blocked,omitempty"`
	// Banned is true while the zone's ban refuses the client, until
	// BannedUntil (Unix seconds), as its refusals say.
	Banned      bool  `json:"banned,omitempty"`
	BannedUntil int64 `json:"banned_until,omitempty"`
	Exempt      bool  `json:"exempt,omitempty"`
	Disabled    bool  `json:"disabled,omitempty"`
	// Sync is the zone's sync interval, for a zone that syncs: the
	// figures are then Redis's, as of the instances' last syncs.
	Sync string `json:"sync,omitempty"`
	// a quota's period (admin_quota.go)
	quotaUsage
}

// serveAdmin routes a request of the admin API to the zones' list or to a
// client's bucket (see AdminAPI).
func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	path := strings.TrimPrefix(r.URL.EscapedPath(), "/rate_limit/")
	if path == "zones" || path == "zones/" {
		if r.Method != http.MethodGet {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
		}
		return writeJSON(w, listZones())
	}
	if path == "overrides" || strings.HasPrefix(path, "overrides/") {
		return serveOverrides(w, r, path)
	}
	if zone, ok := usagePath(path); ok {
		return serveUsage(w, r, zone) // admin_quota.go
	}
	zone, key, method, err := keyRequestOf(r, path)
	if err != nil {
		return err
	}
	ref, found := lookupZone(zone)
	if !found {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no zone %q", zone)}
	}
	return serveKey(w, method, ref, key)
}

// maxKeyBody bounds the body of a POST lookup or reset.
const maxKeyBody = 64 << 10

// keyRequestOf reads the zone, the client key and the operation (GET:
// lookup, DELETE: reset) of a request for a client's bucket: from the path
// ("zones/<zone>/keys/<key>"), or a POST to "zones/<zone>/lookup" or
// "zones/<zone>/reset" with the key in its JSON body.
func keyRequestOf(r *http.Request, path string) (zone, key, method string, err error) {
	if zone, key, ok := parseKeyPath(path); ok {
		return zone, key, r.Method, nil
	}
	rest, _ := strings.CutPrefix(path, "zones/")
	zone, op, ok := strings.Cut(rest, "/")
	ops := map[string]string{"lookup": http.MethodGet, "reset": http.MethodDelete}
	zone, unescapeErr := url.PathUnescape(zone)
	if !ok || ops[op] == "" || unescapeErr != nil || !strings.HasPrefix(path, "zones/") {
		return "", "", "", caddy.APIError{HTTPStatus: http.StatusNotFound,
			Err: fmt.Errorf("want /rate_limit/zones, POST /rate_limit/zones/<zone>/lookup or /reset, or /rate_limit/zones/<zone>/keys/<key>")}
	}
	if r.Method != http.MethodPost {
		return "", "", "", caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: POST", r.Method)}
	}
	var body struct {
		Key *string `json:"key"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxKeyBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Key == nil {
		return "", "", "", caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf(`want a JSON body {"key": "<client key>"}`)}
	}
	return zone, *body.Key, ops[op], nil
}

// parseKeyPath splits "zones/<zone>/keys/<key>", unescaping both.
func parseKeyPath(path string) (zone, key string, ok bool) {
	rest, ok := strings.CutPrefix(path, "zones/")
	if !ok {
		return "", "", false
	}
	zone, key, ok = strings.Cut(rest, "/keys/")
	if !ok {
		return "", "", false
	}
	zone, err1 := url.PathUnescape(zone)
	key, err2 := url.PathUnescape(key)
	return zone, key, err1 == nil && err2 == nil
}

// serveKey serves GET (the usage) and DELETE (a reset) of a client's
// bucket in a zone. The key is grouped by the zone's IP prefixes as the
// requests' keys are. A reset also forgets the client in this instance's
// cache of refused clients; with Redis, other instances forget it within
// localCacheMaxAge.
func serveKey(w http.ResponseWriter, method string, ref zoneRef, key string) error {
	z, store := ref.z, ref.h.store
	req := z.bucket(key)
	// The store waits its own timeout, on a context of its own: a caller
	// that hangs up must not count against a Redis node's breaker.
	ctx := context.Background()
	switch method {
	case http.MethodGet:
		u, err := lookupKey(ref, key) // admin_inforce.go
		if err != nil {
			return err
		}
		return writeJSON(w, u)
	case http.MethodDelete:
		if err := store.Reset(ctx, req); err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("resetting the bucket: %w", err)}
		}
		return writeJSON(w, map[string]any{"zone": z.name, "key": req.Key, "reset": true})
	}
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", method)}
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// Interface guard.
var _ caddy.AdminRouter = (*AdminAPI)(nil)
