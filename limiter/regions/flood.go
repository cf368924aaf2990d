package regions

// A flood of distinct keys (one client sending a new key with every
// request) can bring more buckets in an interval than an instance keeps
// counts of (maxBacklog, since the last interval or for a peer), or than
// the exchanges can tell a peer (see partKeys). What is not counted, or
// not told, never reaches the peers: so from the first count dropped
// until LinkTimeout after the last one, the instance floods. It decides
// with its share (count), and marks itself in no peer (mark), so that
// each peer, once its last mark has expired, counts this region at its
// share too; the counts it keeps go on being told. Each flood is reported
// once as it starts and once as it ends (Events.Flooding), and each count
// dropped (Events.Dropped, for peer "" when this instance could not count
// it at all).

// flooded notes a count that could not be kept: the instance decides
// alone from now, not from the next count.
func (x *Exchange) flooded() {
	x.floodUntil.Store(x.now().Add(LinkTimeout(x.cfg.Interval, x.cfg.Timeout)).UnixNano())
	x.counted.Store(1)
}

// flooding reports whether the instance floods now.
func (x *Exchange) flooding() bool { return x.now().UnixNano() < x.floodUntil.Load() }

// reportFlood tells Events.Flooding when the flood starts or ends; count's
// alone.
func (x *Exchange) reportFlood(on bool) {
	if on == x.floodReported {
		return
	}
	x.floodReported = on
	if ev := x.events(); ev != nil {
		ev.Flooding(on)
	}
}
