//go:build unix

package proxy

import (
	"fmt"
	"syscall"
	"testing"
)

// deadAddr returns a URL on which nothing listens: connections are
// refused. Its port stays bound (a socket bound, never listening) until
// the test ends, so no server of the test, or of another process, is
// given it meanwhile: a port closed at once was handed to the very next
// listener under load, and the "dead" replica answered.
func deadAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
