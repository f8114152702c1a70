//go:build unix

package bench

import (
	"errors"
	"syscall"
)

// smallReceiveBuffer is a Dialer's Control that gives the socket a 4 KB
// receive buffer before it connects, so the window it advertises (and the
// bytes a stalled reader's kernel takes for it) stays small.
func smallReceiveBuffer(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	return errors.Join(err, serr)
}
