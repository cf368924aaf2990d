package clientkey

import (
	"net/netip"
	"testing"
)

func TestSubnet(t *testing.T) {
	cases := []struct {
		key    string
		v4, v6 int
		want   string
	}{
		{"203.0.113.7", 24, 64, "203.0.113.0/24"},
		{"203.0.113.7", 32, 64, "203.0.113.7"},
		{"203.0.113.7", 0, 64, "203.0.113.7"},
		{"2001:db8:1:2:3:4:5:6", 24, 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff::1", 24, 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 24, 48, "2001:db8:1::/48"},
		{"2001:db8::1", 24, 128, "2001:db8::1"},
		{"2001:DB8:0:0::1", 24, 128, "2001:db8::1"}, // one spelling per address
		{"::ffff:203.0.113.7", 24, 64, "203.0.113.0/24"},
		{"fe80::1%eth0", 24, 64, "fe80::/64"},
		{"api-key-123", 24, 64, "api-key-123"},
		{"203.0.113.7:443", 24, 64, "203.0.113.7:443"},
		{"", 24, 64, ""},
	}
	for _, c := range cases {
		if got := Subnet(c.key, c.v4, c.v6); got != c.want {
			t.Errorf("Subnet(%q, %d, %d) = %q; want %q", c.key, c.v4, c.v6, got, c.want)
		}
	}
}

// FuzzSubnet: no input panics; an IP comes back as a prefix holding it (or
// itself), anything else unchanged.
func FuzzSubnet(f *testing.F) {
	for _, s := range []string{"203.0.113.7", "2001:db8::1", "::ffff:1.2.3.4", "fe80::1%eth0", "x", "", "1.2.3.4/24", "::"} {
		f.Add(s, 24, 64)
	}
	f.Fuzz(func(t *testing.T, key string, v4, v6 int) {
		got := Subnet(key, v4, v6)
		addr, err := netip.ParseAddr(key)
		if err != nil {
			if got != key {
				t.Fatalf("Subnet(%q) = %q; a key that is not an IP must stay as it is", key, got)
			}
			return
		}
		addr = addr.Unmap().WithZone("")
		if p, err := netip.ParsePrefix(got); err == nil {
			if !p.Contains(addr) {
				t.Fatalf("Subnet(%q) = %q does not hold the address", key, got)
			}
		} else if got != addr.String() {
			t.Fatalf("Subnet(%q) = %q; want a prefix or the address", key, got)
		}
	})
}
