//go:build !linux

package proxy

import "net"

// sockIO: raw calls are Linux's (sockio_linux.go); elsewhere there is
// none and the net.Conn is used.
type sockIO struct{ net.Conn }

func newPlatformSockIO(net.Conn) *sockIO { return nil }

func (*sockIO) idle() bool { return true }

func (*sockIO) writev(a, b []byte) (int, error) { return 0, nil }
