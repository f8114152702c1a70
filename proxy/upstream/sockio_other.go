//go:build !linux

package upstream

import "net"

// SockIO: raw calls are Linux's (sockio_linux.go); elsewhere there is
// none and the net.Conn is used.
type SockIO struct{ net.Conn }

func newPlatformSockIO(net.Conn) *SockIO { return nil }

func (*SockIO) idle() bool { return true }

func (*SockIO) writev(a, b []byte) (int, error) { return 0, nil }
