package proxy

import (
	"net"
	"syscall"
	"testing"
)

// TestConnLimiterSendBuffer: accepted connections get the send buffer
// set (Linux reports twice what was set: its bookkeeping), and none is
// set at 0, where the kernel's default and its autotuning stay.
func TestConnLimiterSendBuffer(t *testing.T) {
	sndbuf := func(set int) int {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lim := LimitConns(ln, 0, nil, nil)
		defer lim.Close()
		lim.SetSendBuffer(set)
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := lim.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		rc, err := s.(*limitedConn).Conn.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var serr error
		if err := rc.Control(func(fd uintptr) { got, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		return got
	}
	// 64 KB is under any default net.core.wmem_max (208 KB), which caps it.
	if got := sndbuf(64 << 10); got != 2*64<<10 {
		t.Errorf("SO_SNDBUF %d with 64 KB set, want %d", got, 2*64<<10)
	}
	if got := sndbuf(0); got == 2*64<<10 {
		t.Errorf("SO_SNDBUF %d with none set", got)
	}
}
