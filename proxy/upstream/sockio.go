package upstream

import "net"

// SockIO reads and writes one TCP socket with raw system calls where the
// platform has them (sockio_linux.go): the router's two sockets per
// request, the client's (limitedConn) and the replica's (upConn), carry
// about seven reads and writes per proxied request. Made through net.Conn
// each is wrapped in the runtime's entersyscall and exitsyscall, and a
// loopback write runs the receiver's side in the writer's thread, long
// enough that sysmon often takes the processor away from the thread in
// the call (retake, handoffp: another thread woken to run the others)
// and, having taken one, polls again 20 µs later instead of backing off.
// A profile of the router under `hey -c 16` had sysmon's sleeps and
// wake-ups alone at about 10 % of its CPU. These sockets are
// non-blocking, so a call never blocks: made raw, the processor stays
// with the goroutine for the microseconds the kernel takes, as the stream
// loop's calls do. Waiting, deadlines and Close stay the runtime
// poller's (syscall.RawConn).
//
// NewSockIO returns nil where raw calls are not made (another platform,
// a connection that is not a *net.TCPConn): callers use the net.Conn.
func NewSockIO(c net.Conn) *SockIO { return newPlatformSockIO(c) }
