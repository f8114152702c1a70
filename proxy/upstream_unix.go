//go:build unix

package proxy

import "syscall"

// rawReads: the upstream client reads its sockets through RawConn, so
// that a read after a drained one waits for the poller first.
const rawReads = true

// readOnce reads from a non-blocking socket, retrying an interrupted read.
func readOnce(fd uintptr, b []byte) (int, error) {
	for {
		n, err := syscall.Read(int(fd), b)
		if err != syscall.EINTR {
			return n, err
		}
	}
}

// idleOpen peeks at an idle socket without blocking: true when nothing is
// there to read (the server neither closed it nor sent anything unasked).
func idleOpen(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
}
