//go:build linux

package main

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestAwaitAcceptQueue: the wait lasts while a connection is queued and
// ends once the server has accepted it.
func TestAwaitAcceptQueue(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := awaitAcceptQueue(context.Background(), ln); err != nil {
		t.Fatalf("empty queue: %v", err)
	}
	queued, err := net.Dial("tcp", ln.Addr().String()) // handshake done, not accepted
	if err != nil {
		t.Fatal(err)
	}
	defer queued.Close()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := awaitAcceptQueue(cancelled, ln); !errors.Is(err, context.Canceled) {
		t.Fatalf("a connection queued and no server accepting: %v, want the context's error", err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	ctx, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := awaitAcceptQueue(ctx, ln); err != nil {
		t.Fatalf("queue accepted: %v", err)
	}
	if c := <-accepted; c != nil {
		c.Close()
	}
}
