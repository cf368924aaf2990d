package overrides

// stampedAt is o stamped at ms by origin, as another region's instance
// stamps its changes.
func stampedAt(o Override, ms int64, origin string) Override {
	o.Stamp = Stamp{MS: ms, Origin: origin}
	return o
}
