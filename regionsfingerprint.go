package ratelimit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// The regions' fingerprint (see package limiter/regions): what the
// regions of the global zones must agree on, as digests. A handler's part
// is its key secret's and its global zones'; a store's, the union of the
// parts of the handlers that hold it (a reload holds both configs' for a
// moment).

// regionFingerprint is h's part of its store's fingerprint.
func (h *Handler) regionFingerprint() limiter.RegionFingerprint {
	f := limiter.RegionFingerprint{Zones: map[string]limiter.ZoneFingerprint{}}
	for _, z := range h.zones {
		if !z.Global {
			continue
		}
		p := z.policy
		limit := fmt.Sprintf("%s %d/%d burst %d", p.Algorithm, p.Rate, p.Period, p.Burst)
		if p.Algorithm == limiter.Quota { // its calendar: the periods the regions count in
			limit += " per " + p.Calendar.String()
		}
		if strings.Contains(z.Rate+string(z.Burst)+string(z.Quota), "{") { // from placeholders: their templates
			limit += " rate " + z.Rate + " burst " + string(z.Burst) + " quota " + string(z.Quota)
		}
		f.Zones[z.name] = limiter.ZoneFingerprint{Key: printOf(z.Key), Limit: printOf(limit)}
		if f.Secret == "" {
			d := z.hasher.Sum("caddy-rate-limit: the regions' fingerprint of the key secret")
			f.Secret = hex.EncodeToString(d[:8])
		}
	}
	return f
}

// printOf is a short digest of s.
func printOf(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:8])
}

// holdFingerprint records f, h's part of the regions' fingerprint (nil
// when h lets go of the store), and sets the store's: the union of the
// parts held. A zone that two handlers configure differently, or a
// secret, has the digest of both.
func (s *sharedLimiter) holdFingerprint(h *Handler, f *limiter.RegionFingerprint) {
	s.capacityMu.Lock()
	defer s.capacityMu.Unlock()
	if f == nil {
		delete(s.fingerprints, h)
	} else {
		if s.fingerprints == nil {
			s.fingerprints = map[*Handler]limiter.RegionFingerprint{}
		}
		s.fingerprints[h] = *f
	}
	s.SetRegionFingerprint(unionOf(s.fingerprints))
}

// unionOf is the fingerprint of a store whose handlers have parts: each
// zone's, and the secret's, one digest when they agree, else the digest
// of all of theirs.
func unionOf(parts map[*Handler]limiter.RegionFingerprint) limiter.RegionFingerprint {
	secrets, keys, limits := map[string]bool{}, map[string]map[string]bool{}, map[string]map[string]bool{}
	for _, p := range parts {
		if p.Secret != "" {
			secrets[p.Secret] = true
		}
		for name, z := range p.Zones {
			if keys[name] == nil {
				keys[name], limits[name] = map[string]bool{}, map[string]bool{}
			}
			keys[name][z.Key], limits[name][z.Limit] = true, true
		}
	}
	union := limiter.RegionFingerprint{Secret: joinPrints(secrets), Zones: map[string]limiter.ZoneFingerprint{}}
	for name := range keys {
		union.Zones[name] = limiter.ZoneFingerprint{Key: joinPrints(keys[name]), Limit: joinPrints(limits[name])}
	}
	return union
}

// joinPrints is the one digest of set, or a digest of them all.
func joinPrints(set map[string]bool) string {
	all := slices.Sorted(maps.Keys(set))
	if len(all) <= 1 {
		return strings.Join(all, "")
	}
	return printOf(strings.Join(all, ","))
}
