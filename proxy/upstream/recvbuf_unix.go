//go:build unix

package upstream

import "syscall"

// setRecvBuffer sets SO_RCVBUF on a socket not yet connected (Linux
// doubles the value for its bookkeeping, caps it at net.core.rmem_max and
// turns the socket's receive autotuning off).
func setRecvBuffer(fd uintptr, bytes int) error {
	return syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, bytes)
}
