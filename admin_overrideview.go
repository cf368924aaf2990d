package ratelimit

// An override as the admin API shows it (see admin_overrides.go).

import (
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter/overrides"
)

// overrideOutput is an override as the admin API shows it.
type overrideOutput struct {
	Store         string `json:"store,omitempty"`
	Zone          string `json:"zone"`
	KeyDigest     string `json:"key_digest,omitempty"`
	Kind          string `json:"kind"`
	Rate          string `json:"rate,omitempty"`
	Burst         int64  `json:"burst,omitempty"`
	MaxConcurrent int64  `json:"max_concurrent,omitempty"`
	Quota         int64  `json:"quota,omitempty"`
	DryRun        *bool  `json:"dry_run,omitempty"`
	Disabled      bool   `json:"disabled,omitempty"`
	Block         bool   `json:"block,omitempty"`
	Exempt        bool   `json:"exempt,omitempty"`
	ExpiresAt     string `json:"expires_at,omitempty"`
	SetAt         string `json:"set_at,omitempty"`
	By            string `json:"by,omitempty"`
	// Regions tells, for an override of a global zone, whether each peer
	// region's Redis has it ("written") or will ("queued, ...").
	Regions map[string]string `json:"regions,omitempty"`
}

func overrideView(e overrides.Entry) overrideOutput {
	o := e.Override
	v := overrideOutput{Zone: e.Zone, KeyDigest: e.Digest, Kind: o.Kind(), Rate: o.Rate, Burst: o.Burst, MaxConcurrent: o.MaxConcurrent,
		Quota: o.Quota, DryRun: o.DryRun, Disabled: o.Disabled, Block: o.Block, Exempt: o.Exempt, By: o.By}
	if at := o.ExpiresAt(); !at.IsZero() {
		v.ExpiresAt = at.UTC().Format(time.RFC3339Nano)
	}
	if o.Set != 0 {
		v.SetAt = time.UnixMilli(o.Set).UTC().Format(time.RFC3339Nano)
	}
	return v
}
