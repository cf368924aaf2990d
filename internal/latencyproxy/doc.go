// Package latencyproxy simulates, inside a Go test, the network link
// between two regions: a TCP proxy on loopback that delays every byte, and
// that can cut the link or make its far end refuse connections.
//
// # The model
//
// A Proxy stands for the path from clients in one region to one server in
// another: the end-to-end tests give each region's Caddy a Proxy per remote
// Redis (three regions, each reaching the other two's redis-server through
// its own Proxy), so that region A talks to its own Redis directly and to
// B's and C's at inter-region latency.
//
// Latency: every byte crossing the proxy, in either direction, is delivered
// delay after the proxy read it. A request and its reply therefore cost
// 2×delay, like a round trip between regions. Bytes keep their order, and
// the link is pipelined, as a real one is: the proxy reads continuously and
// delivers each chunk at its own read time plus delay, so a stream of chunks
// costs delay once, not once per chunk. Like a TCP window, each direction
// holds at most 1 MiB in flight: past that the proxy stops reading and the
// sender's TCP backs up, so a slow receiver never makes the proxy's memory
// grow, and a direction's throughput is at most 1 MiB per delay. SetDelay
// applies to bytes read after it.
//
// Reset resets every open connection (a TCP RST) and keeps listening;
// Flap cuts the link for a part of every period, then heals it, as a lossy
// or flapping link does.
//
// The link is in one of three states:
//
//   - up: bytes flow, delayed.
//   - cut (Cut), a partition: every open connection is blackholed (the proxy
//     reads bytes from both ends and drops them, bytes already in flight are
//     lost, nothing is delivered, and the connections stay open), and new
//     connections are accepted and blackholed too, without reaching the
//     target. A client sees its requests time out, never a reset.
//   - refused (Refuse), a dead peer: every connection is closed and the
//     listening port is closed, so a new connection is refused.
//
// Heal brings the link up. Connections blackholed while it was cut are then
// closed, since their byte streams lost data and cannot be resumed: clients
// see the error and reconnect. After Refuse, Heal listens again on the same
// address.
//
// Connections: connecting to the proxy is immediate, and the proxy
// connects to the target as soon as it accepts (the handshake costs no
// delay; the first request does). A target that cannot be reached makes the
// proxy close the client's connection. Either side's end of stream (EOF) is
// passed on as a half-close, delayed like its bytes. There is no loss,
// jitter or bandwidth limit besides the window.
package latencyproxy
