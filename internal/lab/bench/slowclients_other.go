//go:build !unix

package bench

import "syscall"

// smallReceiveBuffer leaves the socket's receive buffer as it is here.
func smallReceiveBuffer(_, _ string, _ syscall.RawConn) error { return nil }
