package ratelimit

import (
	"strings"
	"testing"
)

// TestZoneNameReused: a zone name reused in another site with another
// policy fails adapt at the second zone, naming the first; reused alike
// (a snippet imported twice, or written out twice) it adapts; and in
// another store (its own redis block) the name is another zone.
func TestZoneNameReused(t *testing.T) {
	site := func(host, zone string) string {
		return host + " {\n\trate_limit {\n" + zone + "\t}\n\trespond ok\n}\n"
	}
	perIP := func(rate string) string {
		return "\t\tzone per_ip {\n\t\t\tkey {client_ip}\n\t\t\trate " + rate + "\n\t\t}\n"
	}
	_, err := adapt(t, site("a.example", perIP("100r/m"))+site("b.example", perIP("3r/m")))
	want := `zone "per_ip" (key {client_ip}, rate 3r/m) reuses the name of the zone at Caddyfile:3 (key {client_ip}, rate 100r/m) with another policy; ` +
		`zones of one name share their buckets, so define them alike (a snippet imported into each site keeps them so), or give this one a name of its own, at Caddyfile:12`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error = %v\nwant it to contain %q", err, want)
	}
	cheap := "\t\tzone per_ip {\n\t\t\tmatch {\n\t\t\t\tpath /cheap\n\t\t\t}\n\t\t\tkey {client_ip}\n\t\t\trate 100r/m\n\t\t\tcost 1\n\t\t}\n"
	for name, src := range map[string]string{
		"alike":                 site("a.example", perIP("100r/m")) + site("b.example", cheap),
		"imported":              "(limits) {\n\trate_limit {\n" + perIP("100r/m") + "\t}\n}\n\na.example {\n\timport limits\n\trespond ok\n}\n\nb.example {\n\timport limits\n\trespond ok\n}\n",
		"another store":         site("a.example", perIP("100r/m")) + site("b.example", perIP("3r/m")+"\t\tredis {\n\t\t\taddresses 127.0.0.1:6379\n\t\t}\n"),
		"another burst written": site("a.example", perIP("100r/m")) + site("b.example", strings.Replace(perIP("100r/m"), "\t\t}\n", "\t\t\tburst 100\n\t\t}\n", 1)),
	} {
		if _, err := adapt(t, src); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// One Redis namespace, whatever the connection settings: one bucket.
	redisBlock := func(extra string) string {
		return "\t\tredis {\n\t\t\taddresses 127.0.0.1:6379\n" + extra + "\t\t}\n"
	}
	_, err = adapt(t, site("a.example", perIP("100r/m")+redisBlock(""))+site("b.example", perIP("3r/m")+redisBlock("\t\t\ttimeout 2s\n")))
	if err == nil || !strings.Contains(err.Error(), "with another policy") {
		t.Errorf("one Redis, two timeouts: %v; want the reuse refused", err)
	}
	if _, err := adapt(t, site("a.example", perIP("100r/m"))+site("b.example", strings.Replace(perIP("100r/m"), "\t\t}\n", "\t\t\ton_empty_key shared\n\t\t}\n", 1))); err != nil {
		t.Errorf("on_empty_key shared written out: %v; want it the same policy", err)
	}
	_, err = adapt(t, site("a.example", perIP("100r/m"))+site("b.example", strings.Replace(perIP("100r/m"), "\t\t}\n", "\t\t\tipv4_prefix 24\n\t\t}\n", 1)))
	if err == nil || !strings.Contains(err.Error(), "(key {client_ip}, rate 100r/m, ipv4_prefix 24) reuses") {
		t.Errorf("another prefix: %v; want the reuse refused, naming the prefix", err)
	}
	// A different key or algorithm is another policy too.
	for name, other := range map[string]string{
		"key":       strings.Replace(perIP("100r/m"), "{client_ip}", "{http.request.header.X-Key}", 1),
		"algorithm": strings.Replace(perIP("100r/m"), "\t\t}\n", "\t\t\talgorithm fixed_window\n\t\t}\n", 1),
	} {
		if _, err := adapt(t, site("a.example", perIP("100r/m"))+site("b.example", other)); err == nil || !strings.Contains(err.Error(), "with another policy") {
			t.Errorf("%s: error = %v; want the reuse refused", name, err)
		}
	}
}
