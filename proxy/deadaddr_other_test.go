//go:build !unix

package proxy

import (
	"net"
	"testing"
)

// deadAddr returns a URL on which nothing listens: connections are
// refused (the port, closed at once, may be handed to another listener;
// deadaddr_unix_test.go keeps it bound).
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}
