package clientkey

import "net/netip"

// Subnet groups a key that is an IP address into its network: with
// v4bits 24, "203.0.113.7" becomes "203.0.113.0/24"; with v6bits 64,
// "2001:db8::1" becomes "2001:db8::/64". An IPv4-mapped IPv6 address counts
// as IPv4. A key that is not an IP address, or bits that cover the whole
// address, leave the key as it is.
func Subnet(key string, v4bits, v6bits int) string {
	addr, err := netip.ParseAddr(key)
	if err != nil {
		return key
	}
	addr = addr.Unmap().WithZone("")
	bits := v6bits
	if addr.Is4() {
		bits = v4bits
	}
	if bits <= 0 || bits >= addr.BitLen() {
		return addr.String()
	}
	prefix, err := addr.Prefix(bits)
	if err != nil {
		return key
	}
	return prefix.String()
}
