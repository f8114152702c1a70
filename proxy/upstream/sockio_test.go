package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = recv(t, acc, "the accepted connection")
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	// Every read and write of the tests' is bounded.
	_ = client.SetDeadline(time.Now().Add(testWait))
	_ = server.SetDeadline(time.Now().Add(testWait))
	return client, server
}

// The raw calls behave as net.Conn's: all of a large write arrives
// (the socket fills and the writer waits in the poller), reads return
// what arrived, the peer's close is io.EOF, a read deadline is a
// net.Error timeout (net/http's abortPendingRead relies on it) and a
// closed connection is net.ErrClosed.
func TestSockIOIsNetConn(t *testing.T) {
	a, b := tcpPair(t)
	wa, rb := NewSockIO(a), NewSockIO(b)
	if wa == nil || rb == nil {
		t.Skip("no raw socket calls on this platform")
	}
	// The reader starts late: the raw writes fill the socket and wait in
	// the poller for the rest (EAGAIN); the last write, over maxRaw,
	// goes through net.Conn.
	msg := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MB
	errc := make(chan error, 1)
	go func() {
		var err error
		for off := 0; off < len(msg)/2 && err == nil; off += 32 << 10 {
			var n int
			if n, err = wa.Write(msg[off : off+32<<10]); err == nil && n != 32<<10 {
				err = io.ErrShortWrite
			}
		}
		if err == nil {
			var n int
			if n, err = wa.Write(msg[len(msg)/2:]); err == nil && n != len(msg)/2 {
				err = io.ErrShortWrite
			}
		}
		if err == nil {
			err = a.(*net.TCPConn).CloseWrite()
		}
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	got, err := io.ReadAll(rb)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if werr := recv(t, errc, "the write"); werr != nil {
		t.Fatalf("write: %v", werr)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("read %d bytes, want the %d written", len(got), len(msg))
	}
	if n, err := rb.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Errorf("read after the peer's close: %d, %v; want 0, io.EOF", n, err)
	}
	if n, err := rb.Read(nil); n != 0 || err != nil {
		t.Errorf("empty read: %d, %v", n, err)
	}

	c, d := tcpPair(t)
	rd := NewSockIO(d)
	_ = d.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err = rd.Read(make([]byte, 8))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read past the deadline: %v, want a net.Error timeout", err)
	}
	_ = d.SetReadDeadline(time.Time{})
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, err := rd.Read(buf); err != nil || string(buf[:n]) != "hi" {
		t.Errorf("read after the deadline was lifted: %q, %v", buf[:n], err)
	}
	d.Close()
	if _, err := rd.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Errorf("read of a closed connection: %v, want net.ErrClosed", err)
	}
	if _, err := rd.Write(buf); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write to a closed connection: %v, want net.ErrClosed", err)
	}
}

// A peer that reset the connection fails a write with an error, not a
// signal (the raw write's EPIPE or ECONNRESET).
func TestSockIOWriteToResetPeer(t *testing.T) {
	a, b := tcpPair(t)
	wa := NewSockIO(a)
	if wa == nil {
		t.Skip("no raw socket calls on this platform")
	}
	_ = b.(*net.TCPConn).SetLinger(0)
	b.Close()
	var err error
	for range 100 {
		if _, err = wa.Write([]byte("x")); err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" {
		t.Errorf("write to a reset peer: %v, want a write *net.OpError", err)
	}
}

// Idle checks: an open idle connection passes, one its server closed
// or wrote to unasked does not.
func TestIdleOpen(t *testing.T) {
	if !idleChecks {
		t.Skip("no idle checks on this platform")
	}
	for _, tc := range []struct {
		name string
		do   func(net.Conn)
		want bool
	}{
		{"open", func(net.Conn) {}, true},
		{"closed", func(c net.Conn) { c.Close() }, false},
		{"unasked bytes", func(c net.Conn) { _, _ = c.Write([]byte("HTTP/1.1 408\r\n")) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tcpPair(t)
			tc.do(b)
			c := newUpConn(a, "x")
			got := c.alive()
			for i := 0; got != tc.want && i < 100; i++ { // the FIN or bytes take a moment on loopback
				time.Sleep(time.Millisecond)
				got = c.alive()
			}
			if got != tc.want {
				t.Errorf("alive = %v, want %v", got, tc.want)
			}
		})
	}
}

// writev writes both buffers whole, in order, however the socket takes
// them (a large body fills the socket and is written in parts).
func TestSockIOWritev(t *testing.T) {
	for _, size := range []int{0, 1, 8 << 10, 60 << 10, 1 << 20} {
		a, b := tcpPair(t)
		wa := NewSockIO(a)
		if wa == nil {
			t.Skip("no raw socket calls on this platform")
		}
		// A small send buffer and a late reader: a raw writev is
		// written in parts (the head alone, then the body from an
		// offset); 1 MB goes through net.Buffers.
		_ = a.(*net.TCPConn).SetWriteBuffer(8 << 10)
		head := []byte("POST / HTTP/1.1\r\nContent-Length: n\r\n\r\n")
		body := bytes.Repeat([]byte("0123456789abcdef"), size/16)
		errc := make(chan error, 1)
		go func() {
			n, err := wa.writev(head, body)
			if err == nil && n != len(head)+len(body) {
				err = io.ErrShortWrite
			}
			if err == nil {
				err = a.(*net.TCPConn).CloseWrite()
			}
			errc <- err
		}()
		time.Sleep(10 * time.Millisecond)
		got, err := io.ReadAll(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := recv(t, errc, "the writev"); err != nil {
			t.Fatalf("writev of %d bytes: %v", size, err)
		}
		if want := append(append([]byte(nil), head...), body...); !bytes.Equal(got, want) {
			t.Errorf("writev of %d bytes: read %d bytes, not the %d written", size, len(got), len(want))
		}
	}
}
