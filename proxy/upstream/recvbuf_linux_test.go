package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// sockInt reads an int socket option (or, with level -1, the bytes queued
// to read: SIOCINQ) of rc.
func sockInt(t *testing.T, rc syscall.RawConn, level, opt int) int {
	t.Helper()
	var got int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if level < 0 {
			var n int32
			_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
			got = int(n)
			if errno != 0 {
				serr = errno
			}
			return
		}
		got, serr = syscall.GetsockoptInt(int(fd), level, opt)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return got
}

// TestClientRecvBuffer: every connection the client dials, on net/http's
// transport and on the router's own upstream client, gets the receive
// buffer (Linux reports twice what was set: its bookkeeping), and none is
// set at 0, where the kernel's default and its autotuning stay.
func TestClientRecvBuffer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	addr := ln.Addr().String()

	rcvbuf := func(set int) (dialed, own int) {
		t.Helper()
		c := NewClientRecvBuffer(set)
		// net/http's transport dials through the same DialContext.
		nc, err := c.Transport.(*http.Transport).DialContext(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		rc, err := PeerConnOf(nc).Conn.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		dialed = sockInt(t, rc, syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		// The own upstream client takes the transport's dialer.
		u := New(c)
		resp, err := u.Do(context.Background(), "http://"+addr+"/", http.Header{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		own = sockInt(t, resp.Body.(*Body).c.raw, syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		return dialed, own
	}
	// 48 KB is under any default net.core.rmem_max (208 KB), which caps it,
	// and twice it is not tcp_rmem's default (128 KB on recent kernels).
	if d, o := rcvbuf(48 << 10); d != 2*48<<10 || o != 2*48<<10 {
		t.Errorf("SO_RCVBUF %d (dialed), %d (own client) with 48 KB set, want %d", d, o, 2*48<<10)
	}
	if d, o := rcvbuf(0); d == 2*48<<10 || o == 2*48<<10 {
		t.Errorf("SO_RCVBUF %d (dialed), %d (own client) with none set", d, o)
	}
}

// TestClientRecvBufferBoundsStalledStream: a response the router stops
// reading (its client stalled) pins no more than twice the set buffer
// (and a segment) in the router's receive queue, however much the replica has to send and
// however fast the stream ran before. The replica writes until its send
// buffer is full too (a write that cannot finish within its deadline
// once the reader has stopped);
// what the router's socket then holds is read with SIOCINQ. With the
// kernel's autotuning (0) the same stream left about 800 KB queued.
func TestClientRecvBufferBoundsStalledStream(t *testing.T) {
	const set = 64 << 10
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	full := make(chan error, 1)
	stalled, looked, served := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			full <- err
			return
		}
		defer c.Close()
		var req [4096]byte
		if _, err := c.Read(req[:]); err != nil {
			full <- err
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"); err != nil {
			full <- err
			return
		}
		chunk := make([]byte, 16<<10)
		for {
			// The deadline only detects that both queues are full.
			_ = c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := c.Write(chunk); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					select {
					case <-stalled:
						err = nil
					default:
						continue // the reader was only slow: not stalled yet
					}
				}
				full <- err
				<-looked // hold the connection until the test has looked
				return
			}
		}
	}()
	u := New(NewClientRecvBuffer(set))
	resp, err := u.Do(context.Background(), "http://"+ln.Addr().String()+"/", http.Header{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// A stream that ran fast first (4 MB read), as autotuning would grow on.
	if _, err := io.CopyN(io.Discard, resp.Body, 4<<20); err != nil {
		t.Fatal(err)
	}
	close(stalled)
	if err := <-full; err != nil {
		t.Fatal(err)
	}
	queued := sockInt(t, resp.Body.(*Body).c.raw, -1, 0)
	close(looked)
	<-served
	// Linux accounts the doubled buffer and admits a segment while under
	// it, so one more segment (64 KB on the loopback) may be over.
	if limit := 2*set + 64<<10; queued > limit || queued == 0 {
		t.Errorf("%d bytes queued to the stalled reader, want 1 to %d (SO_RCVBUF %d)", queued, limit, set)
	}
	t.Logf("%d bytes queued with SO_RCVBUF %d", queued, set)
}
