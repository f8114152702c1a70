//go:build linux

package main

import (
	"context"
	"errors"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// awaitAcceptQueue returns once ln's accept queue is empty, or with ctx's
// error. Closing a listening socket resets the connections its queue
// holds: their clients completed the handshake, wrote a request, and
// read a reset they cannot tell from a router that crashed after
// dispatching it. Under a steady stream of new connections the server's
// accept loop lags the kernel by a scheduling delay (milliseconds on a
// busy machine), so a close at an arbitrary instant often finds one
// queued; closed right after an empty look, the window shrinks to the
// few microseconds before the close. (A socket filter dropping new SYNs
// would shut it, but kernels built without socket filters refuse one.)
// An error reading the queue is returned and the close goes on as it
// would have.
func awaitAcceptQueue(ctx context.Context, ln net.Listener) error {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return nil
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return err
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		var gerr error
		err := rc.Control(func(fd uintptr) {
			// Linux reports a listening socket's accept queue length
			// as tcpi_unacked.
			info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				gerr = err
				return
			}
			n = int(info.Unacked)
		})
		if err = errors.Join(err, gerr); err != nil || n == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
