//go:build !unix

package deadaddr

import (
	"net"
	"testing"
)

// addr is a listener's port closed at once: refused, though the kernel
// may give the port to another listener meanwhile (deadaddr_unix.go keeps
// it bound).
func addr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}
