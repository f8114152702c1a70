package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/ratelog"
	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Defaults of the edge limits (the router's flags start from these).
const (
	// DefaultBodyTimeout bounds reading one request body: a 16 MB body at
	// 1 MB/s still makes it, a connection trickling a byte every few
	// seconds does not hold a slot for long.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultMaxConns caps open API connections (idle keep-alives
	// included): each costs ~20 KB of buffers and a goroutine.
	DefaultMaxConns = 4096
	// DefaultMaxInflightPerClient caps concurrent inference requests from
	// one client IP address (0 disables: behind an L7 load balancer every
	// request comes from the balancer's address).
	DefaultMaxInflightPerClient = 256
	// DefaultClientSendBuffer is the send buffer (SO_SNDBUF) of an API
	// connection. The kernel's autotuning grows a socket's to 4 MB
	// (tcp_wmem's maximum) for a client that reads nothing, and that
	// kernel memory stays pinned for the write timeout: a stranger's
	// stalled readers, a few thousand of them, would take gigabytes and
	// put every connection of the host under TCP memory pressure. 256 KB
	// still lets a stream run at 2.5 MB/s to a client 100 ms away (one
	// buffer per round trip), over 1,000 times a generation's rate.
	DefaultClientSendBuffer = 256 << 10
)

// edgeMetrics count what the edges refused.
type edgeMetrics struct {
	rejected *prometheus.CounterVec
}

// Reasons of kvmesh_rejected_requests_total.
const (
	rejectClientLimit = "client_inflight"
	rejectConnLimit   = "connections"
	rejectAuth        = "auth"
	rejectBadHop      = "bad_hop_mac"
	rejectBodyTimeout = "body_timeout"
	// rejectWriteTimeout: a response's client took nothing for
	// Config.WriteTimeout (counted once the request is ended).
	rejectWriteTimeout = "write_timeout"
)

func newEdgeMetrics(reg prometheus.Registerer) *edgeMetrics {
	m := &edgeMetrics{rejected: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_rejected_requests_total",
		Help: "Requests and connections the router refused at its edge, by reason.",
	}, []string{"reason"})}
	for _, r := range []string{rejectClientLimit, rejectConnLimit, rejectAuth, rejectBadHop, rejectBodyTimeout, rejectWriteTimeout} {
		m.rejected.WithLabelValues(r)
	}
	return m
}

// ConnRefused counts a connection refused by the connection cap
// (LimitConns' onDrop), with the other edge refusals.
func (p *Proxy) ConnRefused() { p.edge.rejected.WithLabelValues(rejectConnLimit).Inc() }

// clientLimiter counts in-flight requests per client address.
type clientLimiter struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

// acquire admits one more request from addr, or reports false when addr
// already has max in flight.
func (l *clientLimiter) acquire(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n[addr] >= l.max {
		return false
	}
	l.n[addr]++
	return true
}

func (l *clientLimiter) release(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n[addr]--; l.n[addr] <= 0 {
		delete(l.n, addr) // the map holds only addresses with requests in flight
	}
}

// clientAddr is the limiter's key: the peer IP without the port (one
// client opens many connections).
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// admitClient applies the per-client in-flight cap. On refusal it has
// answered 429 with Retry-After and closes the connection, so a flood of
// slow connections does not keep its descriptors.
func (p *Proxy) admitClient(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	if p.clients == nil {
		return func() {}, true
	}
	addr := clientAddr(r)
	if !p.clients.acquire(addr) {
		p.edge.rejected.WithLabelValues(rejectClientLimit).Inc()
		p.junk.Printf("client %s over %d requests in flight: 429", addr, p.clients.max)
		abandonBody(w, r)
		writeRetryLater(w, http.StatusTooManyRequests, time.Second,
			fmt.Sprintf("too many concurrent requests from %s (limit %d)", addr, p.clients.max))
		return nil, false
	}
	return func() { p.clients.release(addr) }, true
}

// abandonBody makes net/http close the connection after this answer
// instead of reading what is left of an unread body (up to 256 KB, at
// the client's pace: a refused slow client would keep its connection
// until the body deadline). A read deadline in the past fails that read
// at once.
func abandonBody(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	if r.Body != nil && r.Body != http.NoBody {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
	}
}

// ConnLimiter is a net.Listener that keeps at most Max connections open.
// Connections over the cap are answered 503 with Retry-After (over TLS
// when TLS is set) and closed at once, so a flood costs the router no
// descriptor for longer than that answer.
type ConnLimiter struct {
	net.Listener
	max     int64
	sendBuf int // SO_SNDBUF of accepted connections (0: the kernel's)
	open    atomic.Int64
	tls     *tls.Config
	rejects chan struct{} // bounds concurrent rejection answers
	onDrop  func(remote string)
}

// LimitConns wraps ln so that at most maxConns accepted connections are
// open at once (maxConns <= 0: no cap). tlsConf, when set, is used only
// to answer refused connections in the protocol the client speaks; wrap
// the result in tls.NewListener for the connections served. onDrop, when
// set, is told of each refused connection.
func LimitConns(ln net.Listener, maxConns int, tlsConf *tls.Config, onDrop func(remote string)) *ConnLimiter {
	return &ConnLimiter{Listener: ln, max: int64(maxConns), tls: tlsConf, rejects: make(chan struct{}, 64), onDrop: onDrop}
}

// SetSendBuffer sets the send buffer (SO_SNDBUF) of every connection
// accepted from now on to bytes (0: the kernel's default, autotuned). A
// set buffer is fixed: Linux doubles it for its bookkeeping, caps it at
// net.core.wmem_max (unprivileged), and turns the socket's autotuning
// off. Call it before serving.
func (l *ConnLimiter) SetSendBuffer(bytes int) { l.sendBuf = max(bytes, 0) }

// Open reports the connections open now.
func (l *ConnLimiter) Open() int { return int(l.open.Load()) }

// Accept returns the next connection under the cap; connections over it
// are refused without being returned.
func (l *ConnLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.max <= 0 || l.open.Add(1) <= l.max {
			if l.max <= 0 {
				l.open.Add(1)
			}
			if tc, ok := c.(*net.TCPConn); ok && l.sendBuf > 0 {
				// Failing leaves the kernel's buffer: not a reason to refuse.
				_ = tc.SetWriteBuffer(l.sendBuf)
			}
			return &limitedConn{Conn: c, l: l, io: upstream.NewSockIO(c)}, nil
		}
		l.open.Add(-1)
		if l.onDrop != nil {
			l.onDrop(c.RemoteAddr().String())
		}
		select {
		case l.rejects <- struct{}{}:
			go l.reject(c)
		default:
			c.Close() // too many refusals under way: just close
		}
	}
}

// overloaded is the raw HTTP/1.1 answer to a connection over the cap.
var overloaded = rawAnswer("503 Service Unavailable", "application/json",
	errorJSON(http.StatusServiceUnavailable, "", "", "the router is at its connection limit; retry shortly"))

// aliveAnswer answers a liveness probe over the cap: the process serves
// (so it is not restarted under a flood); /readyz gets the 503, so a
// balancer sends traffic elsewhere.
var aliveAnswer = rawAnswer("200 OK", "text/plain; charset=utf-8", []byte("ok\n"))

func rawAnswer(status, contentType string, body []byte) []byte {
	return append([]byte("HTTP/1.1 "+status+"\r\nContent-Type: "+contentType+"\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"), body...)
}

func (l *ConnLimiter) reject(c net.Conn) {
	defer func() { <-l.rejects }()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if l.tls != nil {
		tc := tls.Server(c, l.tls)
		if tc.Handshake() != nil {
			return
		}
		c = tc
	}
	answer := overloaded
	// The request line tells a liveness probe from the flood.
	if line, err := bufio.NewReaderSize(c, 256).ReadSlice('\n'); err == nil && bytes.HasPrefix(line, []byte("GET /healthz ")) {
		answer = aliveAnswer
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(answer)
}

// limitedConn gives its slot back once, on the first Close. Its reads
// and writes are raw system calls where it can make them (upstream.SockIO).
type limitedConn struct {
	net.Conn
	l    *ConnLimiter
	io   *upstream.SockIO // nil: the Conn's own
	once sync.Once
}

func (c *limitedConn) Read(p []byte) (int, error) {
	if c.io != nil {
		return c.io.Read(p)
	}
	return c.Conn.Read(p)
}

func (c *limitedConn) Write(p []byte) (int, error) {
	if c.io != nil {
		return c.io.Write(p)
	}
	return c.Conn.Write(p)
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// junkLog logs what strangers cause at most a few lines a second.
type junkLog struct {
	log hclog.Logger
	lim *ratelog.Limiter
}

// Printf logs one warning unless the limiter suppresses it.
func (j junkLog) Printf(format string, args ...any) {
	if ok, suppressed := j.lim.Allow(); ok {
		if suppressed > 0 {
			j.log.Warn(fmt.Sprintf(format, args...), "suppressed_since_last", suppressed)
			return
		}
		j.log.Warn(fmt.Sprintf(format, args...))
	}
}

// DefaultWriteTimeout bounds one write to a client: a client that takes
// no byte of its response for this long (a stalled reader) has its
// request ended as gone (499) and its connection closed, which frees the
// goroutine, buffers and replica connection it held (and cancels its
// generation). nginx's send_timeout has the same meaning and default.
const DefaultWriteTimeout = 60 * time.Second

// writeDeadline bounds each write of a response to its client by
// Config.WriteTimeout. A deadline is set on the connection before a write
// when the last one is older than a quarter of the timeout, so a write
// that takes nothing for between 3/4 of the timeout and the timeout
// fails, at the cost of one clock read per write and a deadline set per
// quarter timeout (net/http's WriteTimeout, by contrast, bounds the whole
// response, which a stream lasting minutes cannot have). The deadline
// also bounds net/http's last flush after the handler; net/http lifts it
// then (Go 1.22 and later), before the connection's next request.
type writeDeadline struct {
	rc  *http.ResponseController
	d   time.Duration
	set time.Time
}

func (p *Proxy) writeDeadline(rc *http.ResponseController) writeDeadline {
	if p.cfg.WriteTimeout <= 0 {
		return writeDeadline{}
	}
	return writeDeadline{rc: rc, d: p.cfg.WriteTimeout}
}

// extend makes sure the next write has a deadline (when a timeout is set).
func (wd *writeDeadline) extend() {
	if wd.d <= 0 {
		return
	}
	now := time.Now()
	if now.Sub(wd.set) < wd.d/4 {
		return
	}
	if wd.rc.SetWriteDeadline(now.Add(wd.d)) == nil {
		wd.set = now
	}
}

// clientGone ends a response whose client write failed with err: 499,
// counted as a write timeout when it was one.
func (st *reqState) clientGone(id string, err error) {
	p := st.p
	st.code = statusClientGone
	if errors.Is(err, os.ErrDeadlineExceeded) {
		p.edge.rejected.WithLabelValues(rejectWriteTimeout).Inc()
		p.junk.Printf("a client of replica %s took nothing of its response for %v: ended", id, p.cfg.WriteTimeout)
		return
	}
	p.log.Debug("client went away mid-response", "replica", id, "error", err)
}
