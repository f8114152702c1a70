//go:build unix

package deadaddr

import (
	"fmt"
	"syscall"
	"testing"
)

// addr binds a TCP socket to 127.0.0.1:0 and never listens on it: a
// connection to its port is refused (RST), and no listener is given the
// port while the socket is open.
func addr(t testing.TB) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		t.Fatalf("bound to %T", sa)
	}
	return fmt.Sprintf("127.0.0.1:%d", in.Port)
}
