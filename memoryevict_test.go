package ratelimit

import (
	"fmt"
	"testing"
)

// TestMemoryFloodSparesOtherZones is the eviction repro through handlers
// that share the memory store at memory_capacity 640: a store full of
// clients of an hourly quota, a drained login bucket, then 6,400 new API
// keys. The drained login client is still refused after the flood (the
// flood evicts the API zone's own buckets; limiter's
// TestMemoryFloodKeepsOtherZones holds the quota clients too).
func TestMemoryFloodSparesOtherZones(t *testing.T) {
	handler := func(zone, rate string) *Handler {
		h := &Handler{MemoryCapacity: 640, Zones: map[string]*Zone{zone: {Key: "{http.request.header.X-Key}", Rate: rate}}}
		if err := provision(t, h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	// A drained login bucket is full again in 5 minutes, a quota client's
	// in 6: the login bucket holds back less time. Its first token comes
	// back in 100 s, long after the test.
	login, quota, api := handler("evict_login", "3r/5m"), handler("evict_quota", "10r/h"), handler("evict_api", "100r/s")
	send := func(h *Handler, key string) int {
		r := clientRequest("GET", "/", "10.0.0.1")
		r.Header.Set("X-Key", key)
		return serve(h, r).Code
	}
	for i := range 640 {
		send(quota, fmt.Sprint("q", i))
	}
	for range 3 {
		send(login, "victim")
	}
	for i := range 6400 {
		send(api, fmt.Sprint("a", i))
	}
	// One attempt: a refusal puts the client in the deny cache, which
	// would answer the next ones without the store.
	if code := send(login, "victim"); code != 429 {
		t.Fatalf("after a flood of 6,400 new API keys, the drained login client got %d; want 429", code)
	}
}
