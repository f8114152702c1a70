package upstream

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"
)

// NewClient returns the default client to replicas and peers: keep-alive
// connections, many idle ones per host, no overall timeout (streams are
// long) and a response-header timeout long enough for a non-streaming
// generation, whose headers only come when it is complete. Compression is
// off so that streams pass through unbuffered and answers can be read.
// Its connections remember whether a peer router announced a dispatch on
// them (package hop), which lets a failed hop be retried safely. The write
// buffer holds a request's headers and a body of up to about 60 KB, so
// that it leaves in one write (one segment, one wake-up of the replica)
// where the default 4 KB buffer took two writes for an 8 KB prompt, the
// second through a fresh 32 KB copy buffer. Its connections' receive
// buffers are DefaultUpstreamRecvBuffer (NewClientRecvBuffer sets another).
func NewClient() *http.Client { return NewClientRecvBuffer(DefaultUpstreamRecvBuffer) }

// NewClientRecvBuffer is NewClient with the receive buffer (SO_RCVBUF) of
// every connection it dials set to bytes (0: the kernel's default,
// autotuned). The one dialer serves both the router's own upstream client
// and net/http's transport (hops, TLS), so every connection to a replica
// or a peer gets it. It is set before connect, when it still decides the
// window scale the router offers: set after, the connection would keep
// the large scale autotuning chose, only capped.
func NewClientRecvBuffer(bytes int) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if bytes > 0 {
		d.Control = recvBufferControl(bytes)
	}
	return &http.Client{Transport: &http.Transport{
		WriteBufferSize:       upstreamWriteBuffer,
		DialContext:           markingDial(d.DialContext),
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: HeaderTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}}
}

// HeaderTimeout bounds the wait for a response to start: the
// headers of a non-streamed generation, which come once it is complete,
// and the first body byte of a stream, whose headers an engine sends at
// once but whose first token waits for the queue and the prefill
// (IdleWatch).
const HeaderTimeout = 10 * time.Minute

// DefaultUpstreamRecvBuffer is the receive buffer (SO_RCVBUF) of each
// connection to a replica or a peer router. When a client stalls a
// stream (its API connection's send buffer full, DefaultClientSendBuffer),
// the router stops reading the replica, whose bytes then fill the
// router's receive queue: Linux autotunes it up to tcp_rmem's maximum
// (6 MB by the kernel's default), and it stays until the write timeout,
// about 1 MB per stalled stream measured (docs/RELIABILITY.md). A set
// buffer is fixed (Linux doubles it for its bookkeeping, caps it at
// net.core.rmem_max and turns autotuning off), so a stalled stream pins
// at most about twice this in kernel memory. The default is safe for
// throughput: the window is a buffer per round trip, 256 KB per 1 ms is
// 256 MB/s on a local link, and an LLM stream is kilobytes per second; a
// cross-region hop at 100 ms still gets 2.5 MB/s per connection, enough
// for streams but a cap on a bulk answer (a large embeddings response)
// that far away. 0 restores the kernel's autotuning.
const DefaultUpstreamRecvBuffer = 256 << 10

// recvBufferControl returns a net.Dialer Control that sets the receive
// buffer of each socket before it connects. A failure leaves the kernel's
// buffer: not a reason to fail the dial.
func recvBufferControl(bytes int) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = setRecvBuffer(fd, bytes) })
	}
}

// upstreamWriteBuffer is the write buffer of each upstream connection.
const upstreamWriteBuffer = 64 << 10

// PeerConn is a connection NewClient dialled. It remembers whether the
// process at its other end has sent a dispatch 103 (package hop): a
// router that sends one on every authenticated hop.
type PeerConn struct {
	net.Conn
	speaks atomic.Bool
}

// Speaks reports whether the far end has announced a dispatch on this
// connection.
func (c *PeerConn) Speaks() bool { return c.speaks.Load() }

// SetSpeaks records that the far end announced a dispatch.
func (c *PeerConn) SetSpeaks() { c.speaks.Store(true) }

// CloseWrite half-closes the connection when the underlying one can.
func (c *PeerConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// markingDial wraps dial so that every connection can be marked as going
// to a router that speaks the dispatch protocol.
func markingDial(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &PeerConn{Conn: c}, nil
	}
}

// PeerConnOf finds the PeerConn under c (a TLS connection wraps it).
func PeerConnOf(c net.Conn) *PeerConn {
	for range 4 {
		switch v := c.(type) {
		case *PeerConn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}
