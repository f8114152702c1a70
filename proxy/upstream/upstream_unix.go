//go:build unix && !linux

package upstream

import "syscall"

// idleChecks: pooled connections can be peeked at without blocking.
const idleChecks = true

// idleOpen peeks at an idle socket without blocking: true when nothing is
// there to read (the server neither closed it nor sent anything unasked).
func idleOpen(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
}
