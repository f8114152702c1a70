package upstream

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

const chunkedOK = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"

// doRead sends one request through u to addr and reads its body to the
// end; it returns the request's error.
func doRead(t *testing.T, u *Client, addr string) error {
	t.Helper()
	resp, err := u.Do(context.Background(), "http://"+addr+"/v1/x", http.Header{}, []byte("{}"))
	if err != nil {
		return err
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "ok" {
		t.Fatalf("body %q %v", b, err)
	}
	resp.Body.Close()
	return nil
}

func idleConns(u *Client, host string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.idle[host])
}

// TestUpstreamClientStreamClosers: a server that closes each connection
// right after a chunked response, without a Connection: close (llama.cpp's
// server ends every stream so), is learnt from the first such connection
// found closed at its reuse; its connections after chunked responses are
// then closed, not pooled, so that a request sent at once after a stream
// ends (a late-bound one woken by that end) does not go out on a
// connection the server is closing.
func TestUpstreamClientStreamClosers(t *testing.T) {
	ln, closed, conns := newClosingServer(t, chunkedOK)
	host := ln.Addr().String()
	u := New(NewClient())
	defer u.CloseIdle()
	for i := range 3 {
		if err := doRead(t, u, host); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		recv(t, closed, "the server's close")
		want := 0
		if i == 0 {
			want = 1 // nothing learnt yet: pooled, and found closed by the next request
		}
		if got := idleConns(u, host); got != want {
			t.Fatalf("after request %d: %d idle connections, want %d", i, got, want)
		}
	}
	if got := conns.Load(); got != 3 {
		t.Fatalf("%d connections, want 3", got)
	}
}

// TestUpstreamClientStreamCloserFailure: a request sent on a connection
// pooled after a stream, which the server closes without answering it
// (the race a peek cannot see), fails as before (it was written: not
// retried), and teaches the client not to pool that server's
// connections after streams.
func TestUpstreamClientStreamCloserFailure(t *testing.T) {
	s := newRawServer(t, chunkedOK, "", chunkedOK)
	host := s.ln.Addr().String()
	u := New(NewClient())
	defer u.CloseIdle()
	if err := doRead(t, u, host); err != nil {
		t.Fatal(err)
	}
	if err := doRead(t, u, host); err == nil {
		t.Fatal("a request the server closed without answering succeeded")
	}
	if err := doRead(t, u, host); err != nil {
		t.Fatal(err)
	}
	if got := idleConns(u, host); got != 0 || s.conns.Load() != 2 {
		t.Fatalf("%d idle connections, %d connections; want 0 and 2", got, s.conns.Load())
	}
}

// TestUpstreamClientIdleTimeoutNotCloser: a connection found closed long
// after its stream (the server's idle timeout) teaches nothing: later
// streams' connections are pooled as before.
func TestUpstreamClientIdleTimeoutNotCloser(t *testing.T) {
	s := newRawServer(t, chunkedOK)
	host := s.ln.Addr().String()
	u := New(NewClient())
	defer u.CloseIdle()
	if err := doRead(t, u, host); err != nil {
		t.Fatal(err)
	}
	// The server closes it for idleness, seconds later.
	u.mu.Lock()
	c := u.idle[host][0]
	c.idleAt = c.idleAt.Add(-2 * closeSoon)
	u.mu.Unlock()
	s.mu.Lock()
	for _, sc := range s.open {
		sc.Close()
	}
	s.mu.Unlock()
	// Until its FIN has reached the client's socket (at once on
	// loopback; bounded all the same).
	for i := 0; c.alive(); i++ {
		if i == 500 {
			t.Fatal("the server's close never reached the client")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := doRead(t, u, host); err != nil {
		t.Fatal(err)
	}
	if s.conns.Load() != 2 {
		t.Fatalf("%d connections, want 2 (the closed one skipped)", s.conns.Load())
	}
	u.mu.Lock()
	learnt := u.closers[host]
	u.mu.Unlock()
	if learnt {
		t.Fatal("an idle timeout was taken for a close after the stream")
	}
	if got := idleConns(u, host); got != 1 {
		t.Fatalf("%d idle connections after a stream, want 1", got)
	}
}
