package deadaddr

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestAddrRefuses: a connection to the address is refused, again and
// again, and a listener on 127.0.0.1:0 is never given its port.
func TestAddrRefuses(t *testing.T) {
	a := Addr(t)
	for range 3 {
		c, err := net.DialTimeout("tcp", a, 5*time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("connected to %s", a)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial %s: %v, want connection refused", a, err)
		}
	}
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		got := l.Addr().String()
		l.Close()
		if got == a {
			t.Fatalf("a listener was given the refused address %s", a)
		}
	}
}
