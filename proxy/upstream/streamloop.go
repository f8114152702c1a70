package upstream

import (
	"errors"
	"net"
)

// The stream loop (Linux, streamloop_linux.go) relays SSE streams from
// owned plain-HTTP replicas to plain HTTP/1.1 clients by their sockets:
// one goroutine waits on an epoll set holding every relayed stream's
// replica socket; when one is readable it reads it once, decodes the
// chunked body, feeds the answer extractor, and writes the bytes framed
// as one HTTP/1.1 chunk (as net/http's chunked writer frames one Write)
// straight to the client's socket. Relaying a token this way costs a
// read, a write and a share of one epoll_wait: no goroutine is woken per
// token, and the read that finds nothing, which Go's poller needs before
// it waits, is never made (docs/history/benchmarks.md, "The stream loop").
//
// Only the body goes this way: the handler writes and flushes the head
// through net/http first, and net/http writes the last chunk once the
// handler returns, so the client sees exactly what the normal path
// sends. A stream leaves the loop back to the normal path (relay's read
// and write loop) when the client's socket is full (a slow client is then
// waited for by its handler's goroutine, as on the normal path) and when the loop
// stops (Proxy.Close); it ends in the loop when the body ends, the
// replica fails or the client goes away (a write fails, or its request's
// context is cancelled, which the handler's goroutine watches).

// upstreamTCPConn returns the TCP connection under a replica connection.
func upstreamTCPConn(c net.Conn) *net.TCPConn {
	if pc, ok := c.(*PeerConn); ok {
		c = pc.Conn
	}
	tc, _ := c.(*net.TCPConn)
	return tc
}

// errAgain: a non-blocking read found nothing (or the loop's one read per
// readiness was spent). Never sticky on a body.
var errAgain = errors.New("would block")

// Outcomes of a stream handed to the loop.
type LoopResult int

const (
	// LoopNotTaken: the loop did not take the stream (off, stopped, or a
	// descriptor could not be had); relay goes on as usual.
	LoopNotTaken LoopResult = iota
	// LoopEOF: the body was relayed to its end.
	LoopEOF
	// LoopHandback: the rest goes the normal way; the bytes returned are
	// the part of a chunk the client's socket did not take, to be written
	// first.
	LoopHandback
	// LoopClientGone: a write to the client failed or its request was
	// cancelled.
	LoopClientGone
	// LoopFailed: reading the replica failed (the error is returned).
	LoopFailed
	// LoopPanicked: the stream's code panicked on the loop (recovered,
	// counted and logged there); the response cannot be finished.
	LoopPanicked
)

// frameRoom is the space before a chunk's data for its size line.
const frameRoom = 16

// putChunkHead writes a chunk's size line as net/http writes it
// ("%x\r\n") at the end of b and returns where it starts.
func putChunkHead(b []byte, n int) int {
	const hex = "0123456789abcdef"
	i := len(b) - 2
	b[i], b[i+1] = '\r', '\n'
	for {
		i--
		b[i] = hex[n&15]
		n >>= 4
		if n == 0 {
			return i
		}
	}
}
