package ratelimit

// The admin API of the run-time overrides:
//
//	GET    /rate_limit/overrides             the overrides in force
//	PUT    /rate_limit/overrides/<zone>      a zone's override (JSON body)
//	DELETE /rate_limit/overrides/<zone>      removes it
//	PUT    /rate_limit/overrides/<zone>/key  a client key's override, the key in the body
//	DELETE /rate_limit/overrides/<zone>/key  removes it, {"key": ...} or {"key_digest": ...}
//
// A change is written to the store of every running handler with a zone
// of that name (with Redis, for the whole fleet), logged at info level,
// and emitted as the Caddy event rate_limit_override. A client key travels
// in the body only, never in the URI, and is kept, listed and logged as
// its digest.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-ratelimit/caddy-rate-limit/internal/jsonerr"
	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// overrideEvent is the Caddy event emitted for every change of an override.
const overrideEvent = "rate_limit_override"

// overrideBody is the body of a PUT or DELETE of an override.
type overrideBody struct {
	Store         string  `json:"store,omitempty"`
	Key           *string `json:"key,omitempty"`
	KeyDigest     string  `json:"key_digest,omitempty"`
	Rate          string  `json:"rate,omitempty"`
	Burst         *int64  `json:"burst,omitempty"`
	MaxConcurrent *int64  `json:"max_concurrent,omitempty"`
	Quota         *int64  `json:"quota,omitempty"`
	DryRun        *bool   `json:"dry_run,omitempty"`
	Disabled      bool    `json:"disabled,omitempty"`
	Block         bool    `json:"block,omitempty"`
	Exempt        bool    `json:"exempt,omitempty"`
	ExpiresIn     string  `json:"expires_in,omitempty"`
	ExpiresAt     string  `json:"expires_at,omitempty"`
}

// overrideTarget is what a request names: a zone, and maybe a key.
type overrideTarget struct {
	zone   string
	refs   []zoneRef      // the zone, in the store (none: an orphan)
	store  *sharedLimiter // where the override is
	orphan bool           // the running config has no zone of that name (a DELETE)
	key    bool           // a key's override
	digest [16]byte       // of the key, as the zone digests it
}

// serveOverrides serves the paths under /rate_limit/overrides.
func serveOverrides(w http.ResponseWriter, r *http.Request, path string) error {
	rest := strings.TrimPrefix(strings.TrimPrefix(path, "overrides"), "/")
	if rest == "" {
		if r.Method != http.MethodGet {
			return apiError(http.StatusMethodNotAllowed, "method %s not allowed: GET lists the overrides; PUT or DELETE /rate_limit/overrides/<zone>[/key] changes one", r.Method)
		}
		return writeJSON(w, listOverrides())
	}
	zone, sub, _ := strings.Cut(rest, "/")
	zone, err := url.PathUnescape(zone)
	if err != nil || sub != "" && sub != "key" {
		return apiError(http.StatusNotFound, "want /rate_limit/overrides/<zone> or /rate_limit/overrides/<zone>/key (the key in the JSON body)")
	}
	if r.Method != http.MethodPut && r.Method != http.MethodDelete {
		return apiError(http.StatusMethodNotAllowed, "method %s not allowed: PUT or DELETE", r.Method)
	}
	body, err := readOverrideBody(r)
	if err != nil {
		return err
	}
	t := overrideTarget{zone: zone, key: sub == "key"}
	if err := t.find(body.Store, r.Method); err != nil {
		return err
	}
	if err := t.readKey(body); err != nil {
		return err
	}
	if r.Method == http.MethodDelete {
		return deleteOverride(w, r, t, body)
	}
	return putOverride(w, r, t, body)
}

// find sets the zone's store: the one named (store), or the only one the
// running config has the zone in. A DELETE may name a zone no longer in
// the config, whose override is still in a store.
func (t *overrideTarget) find(store, method string) error {
	t.refs = zoneRefs(t.zone)
	if store != "" {
		t.refs = slices.DeleteFunc(t.refs, func(r zoneRef) bool { return r.h.store.label() != store })
	}
	var byLabel []zoneRef // stores of one label share their overrides: one of them
	for _, r := range t.refs {
		if !slices.ContainsFunc(byLabel, func(x zoneRef) bool { return x.h.store.label() == r.h.store.label() }) {
			byLabel = append(byLabel, r)
		}
	}
	t.refs = byLabel
	switch {
	case len(t.refs) == 1:
		t.store = t.refs[0].h.store
		return nil
	case len(t.refs) > 1:
		labels := make([]string, len(t.refs))
		for i, r := range t.refs {
			labels[i] = strconv.Quote(r.h.store.label())
		}
		return apiError(http.StatusConflict, "zone %.80q is in %d stores (%s): name one with \"store\" in the body", t.zone, len(t.refs), strings.Join(labels, ", "))
	case method == http.MethodDelete:
		return t.findOrphan(store)
	case store != "":
		return apiError(http.StatusNotFound, "no zone %.80q in store %.120q", t.zone, store)
	}
	return apiError(http.StatusNotFound, "no zone %.80q", t.zone)
}

// findOrphan finds the store holding overrides of a zone that the running
// config no longer has, for a DELETE.
func (t *overrideTarget) findOrphan(store string) error {
	var found []*sharedLimiter
	for _, s := range runningStores() {
		set := s.overrides.Current()
		_, zoned := set.Zone(t.zone)
		if (store == "" || s.label() == store) && (zoned && !t.key || t.key && set.HasKeys(t.zone)) {
			found = append(found, s)
		}
	}
	switch len(found) {
	case 0:
		return apiError(http.StatusNotFound, "no zone %q, and no override of it", t.zone)
	case 1:
		t.store, t.orphan = found[0], true
		return nil
	}
	return apiError(http.StatusConflict, "zone %q has overrides in %d stores: name one with \"store\" in the body", t.zone, len(found))
}

func apiError(status int, format string, args ...any) error {
	return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf(format, args...)}
}

// maxOverrideBody bounds the body of a PUT or DELETE.
const maxOverrideBody = 64 << 10

func readOverrideBody(r *http.Request) (overrideBody, error) {
	var b overrideBody
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxOverrideBody))
	if err != nil {
		return b, apiError(http.StatusBadRequest, "reading the body: %v", err)
	}
	if len(bytes.TrimSpace(raw)) == 0 && r.Method == http.MethodDelete {
		return b, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil || dec.More() {
		return b, apiError(http.StatusBadRequest, "want a JSON object of rate, burst, max_concurrent, dry_run, disabled, block, exempt, expires_in, expires_at (and key for a key's override): %s", jsonProblem(err))
	}
	return b, nil
}

// jsonProblem is what is wrong with a body, without its content (which may
// hold a client key).
func jsonProblem(err error) string {
	if err == nil {
		return "data after the object"
	}
	return jsonerr.Describe(err)
}

// readKey reads the key (or its digest) of a key's override, and refuses
// one on a zone's.
func (t *overrideTarget) readKey(b overrideBody) error {
	if !t.key {
		if b.Key != nil || b.KeyDigest != "" {
			return apiError(http.StatusBadRequest, "a key's override goes to /rate_limit/overrides/%s/key", url.PathEscape(t.zone))
		}
		return nil
	}
	switch {
	case b.Key != nil && b.KeyDigest != "":
		return apiError(http.StatusBadRequest, "give key or key_digest, not both")
	case b.Key != nil && *b.Key == "":
		return apiError(http.StatusBadRequest, "an empty key names the one bucket of every request without a key: refused")
	case b.Key != nil && t.orphan:
		return apiError(http.StatusBadRequest, "zone %q is not in the running config: give the key_digest that GET /rate_limit/overrides shows", t.zone)
	case b.Key != nil:
		t.digest = t.refs[0].z.bucket(*b.Key).Digest()
	case b.KeyDigest != "":
		d, err := overrides.ParseDigest(b.KeyDigest)
		if err != nil {
			return apiError(http.StatusBadRequest, "%v", err)
		}
		t.digest = d
	default:
		return apiError(http.StatusBadRequest, `a key's override needs {"key": "<client key as the zone computes it>"} (or "key_digest" from GET /rate_limit/overrides)`)
	}
	return nil
}

// putOverride validates the override against the zone, with the zone's
// own override for a key's, then writes it.
func putOverride(w http.ResponseWriter, r *http.Request, t overrideTarget, b overrideBody) error {
	now, err := t.store.overrides.Now(context.Background())
	if err != nil {
		return apiError(http.StatusBadGateway, "store %s: reading its clock: %v", t.store.label(), err)
	}
	o, err := b.override(t.key, now)
	if err != nil {
		return apiError(http.StatusBadRequest, "%v", err)
	}
	if err := t.check(&o, now); err != nil {
		return apiError(http.StatusBadRequest, "zone %q: %v", t.zone, err)
	}
	o.By = adminIdentity(r)
	if len(o.By) > 256 {
		o.By = o.By[:256] // Check's bound
	}
	o, err = t.store.overrides.PutStamped(context.Background(), t.zone, t.digestPtr(), o)
	if err != nil {
		return apiError(http.StatusBadGateway, "store %s: %v", t.store.label(), err)
	}
	t.changed("set", &o)
	entry := overrides.Entry{Zone: t.zone, Override: o}
	if t.key {
		entry.Digest = hex.EncodeToString(t.digest[:])
	}
	out := overrideView(entry)
	out.Store = t.store.label()
	out.Regions = t.copyToRegions(&o)
	return writeJSON(w, out)
}

// check reports whether o fits t's zone, and, for a key's, with the
// zone's own override in force.
func (t overrideTarget) check(o *overrides.Override, now time.Time) error {
	z := t.refs[0].z
	p := z.policy
	if zo, ok := t.store.overrides.Current().Zone(z.name); ok && t.key && zo.Active(now) && zo.Fits(p.Algorithm) == nil {
		p = zo.Apply(p, z.Burst != "")
	}
	if err := o.Fits(p.Algorithm); err != nil {
		return err
	}
	p = o.Apply(p, z.Burst != "")
	if err := cmp.Or(p.Validate(), checkAlgorithmLimits(p), t.syncFits(p)); err != nil {
		if t.key {
			return fmt.Errorf("with the zone's override: %w", err)
		}
		return err
	}
	return nil
}

func (t overrideTarget) digestPtr() *[16]byte {
	if t.key {
		return &t.digest
	}
	return nil
}

// copyToRegions copies a change of t's override (o stamped; a tombstone
// when deleted) to the
// peer regions when t's zone is global, and tells how each took it; nil
// when it is not copied.
func (t overrideTarget) copyToRegions(o *overrides.Override) map[string]string {
	if !slices.ContainsFunc(t.refs, func(r zoneRef) bool { return r.z.Global }) {
		return nil
	}
	return t.store.CopyOverride(t.zone, t.digestPtr(), o)
}

// deleteOverride removes the override.
func deleteOverride(w http.ResponseWriter, r *http.Request, t overrideTarget, b overrideBody) error {
	if b != (overrideBody{Key: b.Key, KeyDigest: b.KeyDigest, Store: b.Store}) {
		return apiError(http.StatusBadRequest, `a DELETE takes no fields but the key ({"key": ...} or {"key_digest": ...}) and the store`)
	}
	found, tomb, err := t.store.overrides.DeleteStamped(context.Background(), t.zone, t.digestPtr())
	if err != nil {
		return apiError(http.StatusBadGateway, "store %s: %v", t.store.label(), err)
	}
	if !found {
		return apiError(http.StatusNotFound, "zone %q has no such override", t.zone)
	}
	t.changed("deleted", &overrides.Override{By: adminIdentity(r)})
	out := map[string]any{"zone": t.zone, "deleted": true, "store": t.store.label()}
	if t.key {
		out["key_digest"] = hex.EncodeToString(t.digest[:])
	}
	if regions := t.copyToRegions(&tomb); regions != nil {
		out["regions"] = regions
	}
	return writeJSON(w, out)
}

// changed logs a change at info level and emits it as a Caddy event. A
// key's digest is shown when it is keyed (key_secret, or the memory
// store's): a plain SHA-256 of a guessable key (an address) would tell it.
func (t overrideTarget) changed(action string, o *overrides.Override) {
	fields := []zap.Field{zap.String("zone", t.zone), zap.String("store", t.store.label()), zap.String("action", action), zap.String("by", o.By)}
	data := map[string]any{"zone": t.zone, "store": t.store.label(), "action": action, "by": o.By}
	if t.key && t.keyedDigest() {
		d := hex.EncodeToString(t.digest[:])
		fields, data["key_digest"] = append(fields, zap.String("key_digest", d)), d
	}
	if action == "set" {
		v := overrideView(overrides.Entry{Override: *o})
		fields = append(fields, zap.String("kind", o.Kind()), zap.String("rate", o.Rate), zap.Int64("burst", o.Burst),
			zap.Int64("max_concurrent", o.MaxConcurrent), zap.Int64("quota", o.Quota), zap.String("until", cmp.Or(v.ExpiresAt, "deleted")))
		data["kind"], data["override"] = o.Kind(), v
		if b, ok := t.syncBound(o); ok {
			fields, data["sync_bound"] = append(fields, zap.Int64("sync_bound", b)), b
		}
	}
	logger := caddy.Log().Named("http.handlers.rate_limit")
	if len(t.refs) > 0 {
		logger = t.refs[0].h.logger
	}
	logger.Info("rate limit override "+action, fields...)
	if len(t.refs) > 0 && t.refs[0].h.events != nil {
		t.refs[0].h.events.Emit(t.refs[0].h.eventCtx, overrideEvent, data)
	}
}

// keyedDigest reports whether the zone's key digests are keyed.
func (t overrideTarget) keyedDigest() bool {
	return len(t.refs) > 0 && t.refs[0].z.hasher != nil
}

// maxOverrideExpiry bounds how far an override's expiry may be.
const maxOverrideExpiry = 10 * 365 * 24 * time.Hour

// override is b as an override set at now, checked for its shape.
func (b overrideBody) override(key bool, now time.Time) (overrides.Override, error) {
	o := overrides.Override{Rate: b.Rate, DryRun: b.DryRun, Disabled: b.Disabled, Block: b.Block, Exempt: b.Exempt, Set: now.UnixMilli()}
	for _, f := range []struct {
		name string
		v    *int64
		dst  *int64
	}{{"burst", b.Burst, &o.Burst}, {"max_concurrent", b.MaxConcurrent, &o.MaxConcurrent}, {"quota", b.Quota, &o.Quota}} {
		if f.v != nil && *f.v < 1 {
			return o, fmt.Errorf("%s %d: want a whole number of at least 1", f.name, *f.v)
		}
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	expires, err := b.expiry(now)
	if err != nil {
		return o, err
	}
	o.Expires = expires
	return o, o.Check(key)
}

// expiry is the override's expiry in Unix ms (0: none), from expires_in
// (a duration such as 1h or 2d) or expires_at (RFC 3339).
func (b overrideBody) expiry(now time.Time) (int64, error) {
	var at time.Time
	switch {
	case b.ExpiresIn != "" && b.ExpiresAt != "":
		return 0, errors.New("give expires_in or expires_at, not both")
	case b.ExpiresIn != "":
		d, err := caddy.ParseDuration(b.ExpiresIn)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("expires_in %.40q: want a positive duration such as 30m, 1h or 2d", b.ExpiresIn)
		}
		at = now.Add(d)
	case b.ExpiresAt != "":
		t, err := time.Parse(time.RFC3339, b.ExpiresAt)
		if err != nil {
			return 0, fmt.Errorf("expires_at %.40q: want an RFC 3339 time such as 2026-12-24T18:00:00Z", b.ExpiresAt)
		}
		if !t.After(now) {
			return 0, fmt.Errorf("expires_at %s is in the past", b.ExpiresAt)
		}
		at = t
	default:
		return 0, nil
	}
	if at.Sub(now) > maxOverrideExpiry {
		return 0, fmt.Errorf("expiry more than 10 years away: leave it out for an override until deleted")
	}
	return max(at.UnixMilli(), now.UnixMilli()+1), nil
}

// zoneRefs are the zones named name of the newest config, one per store.
func zoneRefs(name string) []zoneRef {
	registry.Lock()
	defer registry.Unlock()
	var refs []zoneRef
	for i := len(registry.zones) - 1; i >= 0; i-- {
		r := registry.zones[i]
		if r.z.name == name && !slices.ContainsFunc(refs, func(x zoneRef) bool { return x.h.store == r.h.store }) {
			refs = append(refs, r)
		}
	}
	return refs
}

// overrideListing is GET /rate_limit/overrides: the overrides in force in
// each store.
type overrideListing struct {
	Store     string           `json:"store"`
	Version   int64            `json:"version"`
	Overrides []overrideOutput `json:"overrides"`
}

// listOverrides lists the overrides in force in the stores of the
// running handlers.
func listOverrides() []overrideListing {
	stores := runningStores()
	list := make([]overrideListing, 0, len(stores))
	now := time.Now()
	for _, s := range stores {
		set := s.overrides.Current()
		l := overrideListing{Store: s.label(), Version: set.Version(), Overrides: []overrideOutput{}}
		for _, e := range set.Entries(now) {
			l.Overrides = append(l.Overrides, overrideView(e))
		}
		list = append(list, l)
	}
	return list
}

// runningStores are the distinct stores of the running handlers.
func runningStores() []*sharedLimiter {
	registry.Lock()
	defer registry.Unlock()
	var stores []*sharedLimiter
	for _, r := range registry.zones {
		if !slices.ContainsFunc(stores, func(s *sharedLimiter) bool { return s.label() == r.h.store.label() }) {
			stores = append(stores, r.h.store) // stores of one label share their overrides
		}
	}
	return stores
}

// adminIdentity is who made an admin request, as far as Caddy's admin
// endpoint tells: the subject of its client certificate (remote admin),
// else its remote address.
func adminIdentity(r *http.Request) string {
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		return r.TLS.PeerCertificates[0].Subject.String()
	}
	return r.RemoteAddr
}
