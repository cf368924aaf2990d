package ratelimit

import (
	"testing"
	"time"

	"github.com/caddy-ratelimit/caddy-rate-limit/limiter"
)

// TestRegionFingerprint: a handler's fingerprint names its global zones
// alone, and changes with the key secret, a zone's key template and its
// limit; a zone's rate written another way for the same policy does not
// change it. A store's is the union of its handlers'.
func TestRegionFingerprint(t *testing.T) {
	hasher := func(secret string) *limiter.KeyHasher {
		h, err := sharedKeyHasher("redis", secret)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	p := limiter.Policy{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Second, Burst: 30}
	handler := func(secret, key, rate string, p limiter.Policy) *Handler {
		return &Handler{zones: []*Zone{
			{name: "api", Global: true, Key: key, Rate: rate, policy: p, hasher: hasher(secret)},
			{name: "local", Key: key, policy: p, hasher: hasher(secret)},
		}}
	}
	base := handler("a-secret-of-16-chars", "{client_ip}", "100r/s", p).regionFingerprint()
	if len(base.Zones) != 1 || base.Secret == "" || base.Zones["api"].Key == "" {
		t.Fatalf("fingerprint %+v; want the global zone api alone, and a secret", base)
	}
	if same := handler("a-secret-of-16-chars", "{client_ip}", "6000r/m", p).regionFingerprint(); same.Zones["api"] != base.Zones["api"] {
		t.Errorf("6000r/m for 100r/s: %+v; want the same as %+v", same, base)
	}
	burst := p
	burst.Burst = 60
	for what, f := range map[string]limiter.RegionFingerprint{
		"key_secret": handler("another-secret-of-16", "{client_ip}", "100r/s", p).regionFingerprint(),
		"no secret":  handler("", "{client_ip}", "100r/s", p).regionFingerprint(),
		"key":        handler("a-secret-of-16-chars", "{http.request.header.X-API-Key}", "100r/s", p).regionFingerprint(),
		"burst":      handler("a-secret-of-16-chars", "{client_ip}", "100r/s", burst).regionFingerprint(),
	} {
		if f.Secret == base.Secret && f.Zones["api"] == base.Zones["api"] {
			t.Errorf("another %s: %+v; want another fingerprint than %+v", what, f, base)
		}
	}
	h1, h2 := handler("a-secret-of-16-chars", "{client_ip}", "100r/s", p), handler("a-secret-of-16-chars", "{client_ip}", "100r/s", burst)
	f1, f2 := h1.regionFingerprint(), h2.regionFingerprint()
	both := unionOf(map[*Handler]limiter.RegionFingerprint{h1: f1, h2: f2})
	if both.Secret != f1.Secret || both.Zones["api"].Key != f1.Zones["api"].Key ||
		both.Zones["api"].Limit == f1.Zones["api"].Limit || both.Zones["api"].Limit == f2.Zones["api"].Limit {
		t.Errorf("two handlers whose api differs in burst: %+v; want the secret and key of both, a limit of neither", both)
	}
	if one := unionOf(map[*Handler]limiter.RegionFingerprint{h1: f1}); one.Secret != f1.Secret || one.Zones["api"] != f1.Zones["api"] {
		t.Errorf("one handler: %+v; want its own %+v", one, f1)
	}
}
