package ratelimit

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// regionsExample is the Caddyfile of regions' docs: three regions, one
// zone global.
const regionsExample = `:8080 {
	rate_limit {
		redis {
			addresses redis-eu:6379
		}
		regions eu {
			us {
				addresses redis-us:6379
			}
			ap {
				addresses redis-ap-1:6379 redis-ap-2:6379 redis-ap-3:6379
			}
			sync 1s
		}
		zone api {
			key {http.request.header.X-API-Key}
			rate 1000r/m
			global
		}
	}
}`

// TestRegionsCaddyfileAdapts: the regions block adapts to the handler's
// regions (this, peers as redis blocks, sync in ns), and global to the
// zone's global.
func TestRegionsCaddyfileAdapts(t *testing.T) {
	out, err := adapt(t, regionsExample)
	if err != nil {
		t.Fatal(err)
	}
	handlers := rateLimitHandlers([]byte(out))
	if len(handlers) != 1 {
		t.Fatalf("%d rate_limit handlers in\n%s", len(handlers), out)
	}
	var h struct {
		Regions json.RawMessage            `json:"regions"`
		Zones   map[string]json.RawMessage `json:"zones"`
	}
	if err := json.Unmarshal(handlers[0], &h); err != nil {
		t.Fatal(err)
	}
	want := `{"this":"eu","peers":{"us":{"addresses":["redis-us:6379"]},` +
		`"ap":{"addresses":["redis-ap-1:6379","redis-ap-2:6379","redis-ap-3:6379"]}},"sync":1000000000}`
	if !sameJSON(t, string(h.Regions), want) {
		t.Errorf("regions adapted to\n%s\nwant\n%s", h.Regions, want)
	}
	wantZone := `{"key":"{http.request.header.X-API-Key}","rate":"1000r/m","global":true}`
	if !sameJSON(t, string(h.Zones["api"]), wantZone) {
		t.Errorf("zone api adapted to\n%s\nwant\n%s", h.Zones["api"], wantZone)
	}
	// The adapted handler decodes, and its regions check out.
	var handler Handler
	if err := json.Unmarshal(handlers[0], &handler); err != nil {
		t.Fatal(err)
	}
	if err := handler.checkRegions(); err != nil {
		t.Fatalf("checkRegions: %v", err)
	}
	if got := handler.Regions.interval(); got != time.Second {
		t.Fatalf("interval %s; want 1s", got)
	}
}

// TestRegionsCaddyfileOptional: sync defaults to 1s and is left out of
// the JSON; global may be in dry run; peer blocks take any redis option.
func TestRegionsCaddyfileOptional(t *testing.T) {
	src := withRegions("\t\tregions us-east_1 {\n\t\t\teu {\n\t\t\t\taddresses redis-eu:6379\n\t\t\t\tkey_prefix rl:\n"+
		"\t\t\t\tpassword {env.RL_EU_PASSWORD}\n\t\t\t\ttls {\n\t\t\t\t\tserver_name redis.eu\n\t\t\t\t}\n\t\t\t}\n\t\t}",
		"\t\t\tglobal\n\t\t\tdry_run")
	out, err := adapt(t, src)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"regions":{"peers":{"eu":{"addresses":["redis-eu:6379"],"key_prefix":"rl:","password":"{env.RL_EU_PASSWORD}","tls":{"server_name":"redis.eu"}}},"this":"us-east_1"}`,
		`"dry_run":true,"global":true`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("adapted config lacks\n%s\nin\n%s", want, out)
		}
	}
	if got := (&RegionsConfig{}).interval(); got != defaultRegionsSync {
		t.Fatalf("interval %s without sync; want the default, %s", got, defaultRegionsSync)
	}
}

// withRegions is a handler with a redis block, then regions (lines at
// the handler's depth, Caddyfile:6 on), then zone z with zone's lines.
func withRegions(regions, zone string) string {
	return ":8080 {\n\trate_limit {\n\t\tredis {\n\t\t\taddresses redis-eu:6379\n\t\t}\n" + regions +
		"\n\t\tzone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n" + zone + "\n\t\t}\n\t}\n}"
}

// peerUS is a regions block of this region eu and peer us, at
// Caddyfile:6 to 10.
const peerUS = "\t\tregions eu {\n\t\t\tus {\n\t\t\t\taddresses redis-us:6379\n\t\t\t}\n\t\t}"

func TestRegionsCaddyfileErrors(t *testing.T) {
	regions := func(body string) string { return withRegions("\t\tregions eu {\n"+body+"\n\t\t}", "") }
	us := "\t\t\tus {\n\t\t\t\taddresses redis-us:6379\n\t\t\t}\n"            // Caddyfile:7 to 9 in regions
	global := func(lines string) string { return withRegions(peerUS, lines) } // lines from Caddyfile:14
	// Zones without a rate (events, max_concurrent), or without regions.
	zoneOnly := func(lines string) string {
		return ":8080 {\n\trate_limit {\n\t\tredis {\n\t\t\taddresses a:1\n\t\t}\n\t\tzone z {\n\t\t\tkey k\n" + lines + "\n\t\t}\n\t}\n}"
	}
	withPeers := func(lines string) string { // lines from Caddyfile:13
		return ":8080 {\n\trate_limit {\n\t\tredis {\n\t\t\taddresses a:1\n\t\t}\n" + peerUS + "\n\t\tzone z {\n\t\t\tkey k\n" + lines + "\n\t\t}\n\t}\n}"
	}
	cases := []struct {
		name, src, want string
	}{
		{"this name upper case", withRegions("\t\tregions EU {\n"+us+"\t\t}", ""), `regions: region name "EU": want 1 to 32 characters of a-z, 0-9, '_' and '-', such as eu or us-east-1, at Caddyfile:6`},
		{"peer name too long", regions("\t\t\t" + strings.Repeat("a", 33) + " {\n\t\t\t\taddresses a:1\n\t\t\t}"), `regions: region name "` + strings.Repeat("a", 33) + `": want 1 to 32 characters of a-z, 0-9, '_' and '-', such as eu or us-east-1, at Caddyfile:7`},
		{"peer name dot", regions("\t\t\tus.east {\n\t\t\t\taddresses a:1\n\t\t\t}"), `region name "us.east": want 1 to 32 characters of a-z, 0-9, '_' and '-'`},
		{"no name", withRegions("\t\tregions {\n"+us+"\t\t}", ""), `regions needs this region's name: regions <this region> { <region> { addresses <its Redis> } ... }, at Caddyfile:6`},
		{"two names", withRegions("\t\tregions eu us {\n"+us+"\t\t}", ""), `regions takes one name, this region's, not "us" too: the other regions go in its block, at Caddyfile:6`},
		{"peer twice", regions(us + "\t\t\tus {\n\t\t\t\taddresses redis-us-2:6379\n\t\t\t}"), `regions: region "us" is given twice: one block per region, at Caddyfile:10`},
		{"this among peers", regions(us + "\t\t\teu {\n\t\t\t\taddresses redis-eu:6379\n\t\t\t}"), `regions: "eu" is this region: list only the other regions, each with its Redis (this region's Redis is the redis block), at Caddyfile:10`},
		{"no peers", regions("\t\t\tsync 1s"), `regions: no other region: add a block per other region with its Redis, such as us { addresses redis-us:6379 } (a fleet in one region needs no regions), at Caddyfile:6`},
		{"no block", withRegions("\t\tregions eu", ""), `regions: no other region`},
		{"regions twice", withRegions(peerUS+"\n"+peerUS, ""), `regions is already configured: give one regions block, with every other region in it, at Caddyfile:11`},
		{"peer's other key prefix", regions("\t\t\tus {\n\t\t\t\taddresses redis-us:6379\n\t\t\t\tkey_prefix us:\n\t\t\t}\n"), `regions: region "us": key_prefix "us:" is not this region's "rl:": every region keeps a global zone's buckets under one prefix, and charges the others' by name; give each region's Redis the same key_prefix, at Caddyfile:`},
		{"sync too short", regions(us + "\t\t\tsync 50ms"), `regions: sync "50ms": want an interval from 100ms to 1m0s, such as 1s (the default), at Caddyfile:10`},
		{"sync too long", regions(us + "\t\t\tsync 2m"), `regions: sync "2m": want an interval from 100ms to 1m0s`},
		{"sync not a duration", regions(us + "\t\t\tsync soon"), `regions: sync "soon": want an interval`},
		{"sync twice", regions(us + "\t\t\tsync 1s\n\t\t\tsync 2s"), `regions: sync is already set, at Caddyfile:11`},
		{"sync without value", regions(us + "\t\t\tsync"), `wrong argument count`},
		{"peer without addresses", regions("\t\t\tus {\n\t\t\t\ttimeout 1s\n\t\t\t}"), `regions: region "us": redis: addresses is required, at Caddyfile:9`},
		{"peer unknown option", regions("\t\t\tus {\n\t\t\t\taddresses a:1\n\t\t\t\tnodes 3\n\t\t\t}"), `regions: region "us": redis: unrecognized subdirective "nodes", at Caddyfile:9`},
		{"peer bad timeout", regions("\t\t\tus {\n\t\t\t\taddresses a:1\n\t\t\t\ttimeout soon\n\t\t\t}"), `regions: region "us": redis: timeout "soon": want a positive duration such as 100ms, at Caddyfile:9`},
		{"peer db in a cluster", regions("\t\t\tus {\n\t\t\t\taddresses a:1 b:1\n\t\t\t\tdb 2\n\t\t\t}"), `regions: region "us": redis: db 2: Redis Cluster has only db 0, at Caddyfile:7`},
		{"peer argument", regions("\t\t\tus x {\n\t\t\t\taddresses a:1\n\t\t\t}"), `regions: region "us": wrong argument count`},
		{"regions without redis", ":8080 {\n\trate_limit {\n" + peerUS + "\n\t\tzone z {\n\t\t\tkey k\n\t\t\trate 1r/s\n\t\t}\n\t}\n}", `regions needs a redis block: each region decides from its own Redis, and tells the others' Redis what it admitted; add redis { addresses <this region's Redis> }, at Caddyfile:3`},
		{"global without regions", zoneOnly("\t\t\trate 1r/s\n\t\t\tglobal"), `zone "z": global needs regions: a limit for the whole world is shared across the regions of the handler's regions block; add regions <this region> { <region> { addresses <its Redis> } }, or leave global out, at Caddyfile:9`},
		{"global with an argument", global("\t\t\tglobal yes"), `zone "z": global takes no argument, not "yes": write global alone, and the zone has one limit across the regions of the regions block, at Caddyfile:14`},
		{"global fixed_window", global("\t\t\tglobal\n\t\t\talgorithm fixed_window"), `zone "z": global needs algorithm token_bucket (the default), not fixed_window: a window's limit is spent at once: a region could spend a whole window before the others hear of it, so the world would admit up to one window per region; use token_bucket with a burst, at Caddyfile:15`},
		{"global after sliding_window_counter", global("\t\t\talgorithm sliding_window_counter\n\t\t\tglobal"), `not sliding_window_counter: a window's limit is spent at once: a region could spend a whole window before the others hear of it, so the world would admit up to one window per region; use token_bucket with a burst, at Caddyfile:15`},
		{"global sliding_window_log", global("\t\t\tglobal\n\t\t\talgorithm sliding_window_log"), `not sliding_window_log: its state is the time of each request it admitted, and it cannot take a charge made in another region after the fact; use token_bucket, at Caddyfile:15`},
		{"global leaky_bucket", global("\t\t\tglobal\n\t\t\talgorithm leaky_bucket"), `not leaky_bucket: its state is the queue of requests waiting their turn in this region, and it cannot take a charge made in another region after the fact; use token_bucket with a burst, at Caddyfile:15`},
		{"global count_status", global("\t\t\tglobal\n\t\t\tcount_status 401"), `zone "z": global does not apply with count_status or cost_from_response: what they give back or charge after the response is not told to the other regions; leave global out, or count every request, at Caddyfile:15`},
		{"global cost_from_response", global("\t\t\tcost_from_response X-Cost\n\t\t\tglobal"), `global does not apply with count_status or cost_from_response: what they give back or charge after the response is not told to the other regions; leave global out, or count every request, at Caddyfile:15`},
		{"global events", withPeers("\t\t\tglobal\n\t\t\tevents 10\n\t\t\twindow 1m"), `not sliding_window_log: its state is the time of each request it admitted, and it cannot take a charge made in another region after the fact; use token_bucket, at Caddyfile:15`},
		{"global quota with sync", withPeers("\t\t\tquota 10 per day\n\t\t\tglobal\n\t\t\tsync 1s"), `zone "z": a global quota is decided in each region's Redis, and does not sync: leave sync out (each request is one call to the region's own Redis), or global out, at Caddyfile:15`},
		{"global max_concurrent", withPeers("\t\t\tmax_concurrent 5\n\t\t\tglobal"), `zone "z": global does not apply to max_concurrent: requests in flight are held and released in one region, and are not admissions that can be told to the other regions; leave global out (the limit is per region), at Caddyfile:14`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := adapt(t, c.src)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

// TestRegionsGlobalQuota: a quota may be global (without sync).
func TestRegionsGlobalQuota(t *testing.T) {
	src := ":8080 {\n\trate_limit {\n\t\tredis {\n\t\t\taddresses a:1\n\t\t}\n" + peerUS +
		"\n\t\tzone z {\n\t\t\tkey k\n\t\t\tquota 10 per day\n\t\t\ttime_zone Europe/Paris\n\t\t\tglobal\n\t\t}\n\t}\n}"
	out, err := adapt(t, src)
	if want := `"global":true,"key":"k","quota":10,"quota_per":"day","time_zone":"Europe/Paris"`; err != nil || !strings.Contains(out, want) {
		t.Errorf("a global quota adapted to %s, %v; want %s", out, err, want)
	}
}

// TestRegionsJSONErrors: a JSON config fails to provision with the
// errors a Caddyfile gets at adapt time, before any store is acquired
// (the Redis addresses here answer nothing).
func TestRegionsJSONErrors(t *testing.T) {
	redis := func() *RedisConfig { return &RedisConfig{Addresses: []string{"127.0.0.1:1"}} }
	us := func() map[string]*RedisConfig { return map[string]*RedisConfig{"us": redis()} }
	regions := func(this string, peers map[string]*RedisConfig, sync time.Duration) *RegionsConfig {
		return &RegionsConfig{This: this, Peers: peers, Sync: caddy.Duration(sync)}
	}
	global := func(z *Zone) map[string]*Zone {
		z.Key, z.Global = "k", true
		return map[string]*Zone{"z": z}
	}
	tokenBucket := func() map[string]*Zone { return global(&Zone{Rate: "1r/s"}) }
	cases := []struct {
		name string
		h    *Handler
		want string
	}{
		{"regions without redis", &Handler{Regions: regions("eu", us(), 0), Zones: tokenBucket()}, `regions needs a redis block: each region decides from its own Redis`},
		{"global without regions", &Handler{Redis: redis(), Zones: tokenBucket()}, `zone "z": global needs regions: a limit for the whole world is shared across the regions of the handler's regions block; add regions`},
		{"no this", &Handler{Redis: redis(), Regions: regions("", us(), 0), Zones: tokenBucket()}, `regions: this is required: the name of the region this Caddy is in, such as eu`},
		{"bad this", &Handler{Redis: redis(), Regions: regions("Europe West", us(), 0), Zones: tokenBucket()}, `regions: this: region name "Europe West": want 1 to 32 characters of a-z, 0-9, '_' and '-'`},
		{"no peers", &Handler{Redis: redis(), Regions: regions("eu", nil, 0), Zones: tokenBucket()}, `regions: no other region: add a block per other region with its Redis`},
		{"bad peer name", &Handler{Redis: redis(), Regions: regions("eu", map[string]*RedisConfig{strings.Repeat("x", 33): redis()}, 0), Zones: tokenBucket()}, `regions: peers: region name "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx": want 1 to 32 characters`},
		{"this among peers", &Handler{Redis: redis(), Regions: regions("eu", map[string]*RedisConfig{"eu": redis(), "us": redis()}, 0), Zones: tokenBucket()}, `regions: "eu" is this region: list only the other regions`},
		{"null peer", &Handler{Redis: redis(), Regions: regions("eu", map[string]*RedisConfig{"us": nil}, 0), Zones: tokenBucket()}, `regions: region "us": redis: no configuration: give its addresses, as a redis block's`},
		{"peer without addresses", &Handler{Redis: redis(), Regions: regions("eu", map[string]*RedisConfig{"us": {}}, 0), Zones: tokenBucket()}, `regions: region "us": redis: addresses: at least one host:port, none empty`},
		{"peer key prefix", &Handler{Redis: redis(), Regions: regions("eu", map[string]*RedisConfig{"us": {Addresses: []string{"a:1"}, KeyPrefix: "{x}"}}, 0), Zones: tokenBucket()}, `regions: region "us": redis: key_prefix "{x}" must not contain { or }`},
		{"peer short key secret", &Handler{Redis: redis(), Regions: regions("eu", map[string]*RedisConfig{"us": {Addresses: []string{"a:1"}, KeySecret: "short"}}, 0), Zones: tokenBucket()}, `regions: region "us": redis: key_secret: at least 16 characters, not 5`},
		{"peer's other key prefix", &Handler{Redis: redis(), Regions: regions("eu", map[string]*RedisConfig{"us": {Addresses: []string{"a:1"}, KeyPrefix: "us:"}}, 0), Zones: tokenBucket()}, `regions: region "us": key_prefix "us:" is not this region's "rl:": every region keeps a global zone's buckets under one prefix`},
		{"peer's other key secret", &Handler{Redis: redis(), Regions: regions("eu", map[string]*RedisConfig{"us": {Addresses: []string{"a:1"}, KeySecret: strings.Repeat("u", 16)}}, 0), Zones: tokenBucket()}, `regions: region "us": key_secret is not this region's: client keys are hashed with it`},
		{"sync too short", &Handler{Redis: redis(), Regions: regions("eu", us(), 10*time.Millisecond), Zones: tokenBucket()}, `regions: sync 10ms: want an interval from 100ms to 1m0s, such as 1s (the default)`},
		{"sync too long", &Handler{Redis: redis(), Regions: regions("eu", us(), time.Hour), Zones: tokenBucket()}, `regions: sync 1h0m0s: want an interval from 100ms to 1m0s`},
		{"sync negative", &Handler{Redis: redis(), Regions: regions("eu", us(), -time.Second), Zones: tokenBucket()}, `regions: sync -1s: want an interval`},
		{"global fixed_window", &Handler{Redis: redis(), Regions: regions("eu", us(), 0), Zones: global(&Zone{Rate: "1r/s", Algorithm: "fixed_window"})}, `zone "z": global needs algorithm token_bucket (the default), not fixed_window: a window's limit is spent at once`},
		{"global events", &Handler{Redis: redis(), Regions: regions("eu", us(), 0), Zones: global(&Zone{MaxEvents: 10, Window: caddy.Duration(time.Minute)})}, `zone "z": global needs algorithm token_bucket (the default), not sliding_window_log: its state is the time of each request it admitted`},
		{"global leaky_bucket", &Handler{Redis: redis(), Regions: regions("eu", us(), 0), Zones: global(&Zone{Rate: "1r/s", Algorithm: "leaky_bucket"})}, `not leaky_bucket: its state is the queue of requests waiting their turn in this region`},
		{"global max_concurrent", &Handler{Redis: redis(), Regions: regions("eu", us(), 0), Zones: global(&Zone{MaxConcurrent: 3})}, `zone "z": global does not apply to max_concurrent: requests in flight are held and released in one region`},
		{"global count_status", &Handler{Redis: redis(), Regions: regions("eu", us(), 0), Zones: global(&Zone{Rate: "1r/s", CountStatus: []int{401}})}, `zone "z": global does not apply with count_status or cost_from_response`},
		{"global in rate_limits", &Handler{Redis: redis(), RateLimits: global(&Zone{MaxEvents: 10, Window: caddy.Duration(time.Minute)})}, `zone "z": global needs regions`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := provision(t, c.h)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, c.want)
			}
		})
	}
}

// TestRegionsJSONValid: regions with a redis block and a global token
// bucket (in dry run, or not) check out, and so do zones that are not
// global, of any kind, beside them.
func TestRegionsJSONValid(t *testing.T) {
	raw := `{"redis":{"addresses":["redis-eu:6379"],"key_secret":"{env.RL_REGIONS_TEST_SECRET}"},
		"regions":{"this":"eu","peers":{"us":{"addresses":["redis-us:6379"],"key_secret":"{env.RL_REGIONS_TEST_SECRET}"},"ap-1":{"addresses":["a:1","b:1"]}},"sync":100000000},
		"zones":{"api":{"key":"k","rate":"1r/s","burst":10,"global":true},"dry":{"key":"k","rate":"1r/s","global":true,"dry_run":true},
			"window":{"key":"k","rate":"1r/s","algorithm":"fixed_window"},"slots":{"key":"k","max_concurrent":2}}}`
	t.Setenv("RL_REGIONS_TEST_SECRET", strings.Repeat("s", 16))
	var h Handler
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		t.Fatal(err)
	}
	if err := h.checkRegions(); err != nil {
		t.Fatalf("checkRegions: %v", err)
	}
	for _, name := range sortedNames(h.Zones) {
		z := h.Zones[name]
		z.name = name
		if err := z.check(); err != nil {
			t.Errorf("zone %q: %v", name, err)
		}
	}
	if got := h.Regions.interval(); got != minRegionsSync {
		t.Fatalf("interval %s; want 100ms", got)
	}
	if err := (&Handler{}).checkRegions(); err != nil {
		t.Fatalf("checkRegions without regions nor global zones: %v", err)
	}
}
