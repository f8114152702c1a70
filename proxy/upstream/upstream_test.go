package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// scriptConn is a net.Conn whose reads return a canned response in pieces
// of at most step bytes (so that every buffer boundary is crossed) and
// whose writes are kept.
type scriptConn struct {
	net.Conn
	in     []byte
	step   int
	out    bytes.Buffer
	closed bool
}

func (c *scriptConn) Read(b []byte) (int, error) {
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := min(len(b), len(c.in), max(c.step, 1))
	copy(b, c.in[:n])
	c.in = c.in[n:]
	return n, nil
}
func (c *scriptConn) Write(b []byte) (int, error)      { return c.out.Write(b) }
func (c *scriptConn) Close() error                     { c.closed = true; return nil }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// readScripted reads one response (head and body) off a scripted
// connection.
func readScripted(raw string, step int) (*http.Response, []byte, *Body, error) {
	u := &Client{idle: map[string][]*upConn{}, maxIdle: 4}
	c := newUpConn(&scriptConn{in: []byte(raw), step: step}, "r")
	resp, err := c.readResponse(context.Background(), u, func() bool { return true })
	if err != nil {
		return nil, nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	return resp, body, resp.Body.(*Body), err
}

func TestUpstreamResponses(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		status    int
		body      string
		length    int64
		header    map[string]string
		reuse     bool
		err       error // errors.Is target; nil: success
	}{
		{name: "content length", raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello",
			status: 200, body: "hello", length: 5, header: map[string]string{"Content-Type": "application/json"}, reuse: true},
		{name: "lf only lines", raw: "HTTP/1.1 200 OK\nContent-Length: 2\n\nhi", status: 200, body: "hi", length: 2, reuse: true},
		{name: "chunked with extension and trailer", raw: "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" +
			"5;ext=1\r\ndata:\r\nA\r\n tok tok  \r\n0\r\nX-Trailer: t\r\n\r\n", status: 200, body: "data: tok tok  ", length: -1, reuse: true},
		{name: "chunked upper hex", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1A\r\n" + strings.Repeat("z", 26) + "\r\n0\r\n\r\n",
			status: 200, body: strings.Repeat("z", 26), length: -1, reuse: true},
		{name: "early hints and continue skipped", raw: "HTTP/1.1 103 Early Hints\r\nX-Kvmesh-Dispatched: 1\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n" +
			"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nok", status: 200, body: "ok", length: 2, header: map[string]string{"X-A": "b", "X-Kvmesh-Dispatched": ""}, reuse: true},
		{name: "connection close", raw: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", status: 200, body: "ok", length: 2},
		{name: "until close", raw: "HTTP/1.1 200 OK\r\n\r\nall of it", status: 200, body: "all of it", length: -1},
		{name: "http/1.0 keep-alive", raw: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx", status: 200, body: "x", length: 1, reuse: true},
		{name: "http/1.0", raw: "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", status: 200, body: "x", length: 1},
		{name: "no content", raw: "HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n", status: 204, length: 0, reuse: true},
		{name: "empty", raw: "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n\r\n", status: 503, length: 0,
			header: map[string]string{"Retry-After": "1"}, reuse: true},
		{name: "no reason phrase", raw: "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", status: 200, length: 0, reuse: true},
		{name: "repeated equal lengths", raw: "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\nok", status: 200, body: "ok", length: 2, reuse: true},
		{name: "chunked and length", raw: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
			status: 200, body: "ok", length: -1, header: map[string]string{"Content-Length": ""}},
		{name: "other transfer coding", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nzz", status: 200, body: "zz", length: -1},
		{name: "truncated length", raw: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", err: io.ErrUnexpectedEOF},
		{name: "truncated chunk", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nshort", err: io.ErrUnexpectedEOF},
		{name: "no last chunk", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", err: io.ErrUnexpectedEOF},
		{name: "chunk longer than size", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokay\r\n0\r\n\r\n", err: errUpstreamProtocol},
		{name: "bad chunk size", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", err: errUpstreamProtocol},
		{name: "huge chunk size", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1000000000000000\r\n", err: errUpstreamProtocol},
		{name: "lengths differ", raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok", err: errUpstreamProtocol},
		{name: "negative length", raw: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", err: errUpstreamProtocol},
		{name: "signed length", raw: "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok", err: errUpstreamProtocol},
		{name: "http/2 status line", raw: "HTTP/2 200 OK\r\n\r\n", err: errUpstreamProtocol},
		{name: "short code", raw: "HTTP/1.1 20 OK\r\n\r\n", err: errUpstreamProtocol},
		{name: "code below 100", raw: "HTTP/1.1 099 x\r\n\r\n", err: errUpstreamProtocol},
		{name: "folded header", raw: "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", err: errUpstreamProtocol},
		{name: "space before colon", raw: "HTTP/1.1 200 OK\r\nX-A : a\r\n\r\n", err: errUpstreamProtocol},
		{name: "control byte in value", raw: "HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n\r\n", err: errUpstreamProtocol},
		{name: "switching protocols", raw: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", err: errUpstreamProtocol},
		{name: "truncated head", raw: "HTTP/1.1 200 OK\r\nContent-Le", err: errUpstreamProtocol},
		{name: "nothing", raw: "", err: io.EOF},
	} {
		for _, step := range []int{1, 3, 1 << 20} {
			resp, body, b, err := readScripted(tc.raw, step)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Errorf("%s (step %d): error %v, want %v", tc.name, step, err, tc.err)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s (step %d): %v", tc.name, step, err)
				continue
			}
			if resp.StatusCode != tc.status || string(body) != tc.body || resp.ContentLength != tc.length {
				t.Errorf("%s (step %d): %d %q length %d, want %d %q length %d", tc.name, step, resp.StatusCode, body, resp.ContentLength, tc.status, tc.body, tc.length)
			}
			for k, v := range tc.header {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s: header %s = %q, want %q", tc.name, k, got, v)
				}
			}
			if resp.Header.Get("Transfer-Encoding") != "" {
				t.Errorf("%s: Transfer-Encoding left in the header", tc.name)
			}
			if reuse := b.eof && b.reuse; reuse != tc.reuse {
				t.Errorf("%s (step %d): reusable %v, want %v", tc.name, step, reuse, tc.reuse)
			}
		}
	}
}

// TestUpstreamChunksCoalesce: one Read returns every chunk the socket
// delivered at once, so that a burst of tokens is one write to the client.
func TestUpstreamChunksCoalesce(t *testing.T) {
	var raw strings.Builder
	raw.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
	for range 5 {
		raw.WriteString("6\r\ndata:x\r\n")
	}
	raw.WriteString("0\r\n\r\n")
	u := &Client{idle: map[string][]*upConn{}, maxIdle: 4}
	c := newUpConn(&scriptConn{in: []byte(raw.String()), step: 1 << 20}, "r")
	resp, err := c.readResponse(context.Background(), u, func() bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1024)
	n, err := resp.Body.Read(buf)
	if n != 30 || err != io.EOF {
		t.Fatalf("first read: %d bytes, %v; want all 30 and EOF", n, err)
	}
}

func TestAppendRequest(t *testing.T) {
	hdr := http.Header{
		"Authorization":   {"Bearer k"},
		"Connection":      {"close, X-Drop"},
		"X-Drop":          {"1"},
		"Accept-Encoding": {"gzip"},
		"Expect":          {"100-continue"},
		"X-Kvmesh-Hop":    {"forged"},
		"Keep-Alive":      {"1"},
		"X-Evil":          {"a\r\nInjected: 1"},
		"Bad Name":        {"x"},
		"X-Multi":         {"1", "2"},
	}
	b := appendRequest(new([]byte), "127.0.0.1:8000", "/v1/chat/completions?x=1", hdr, 42)
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(*b)))
	if err != nil {
		t.Fatalf("the head does not parse: %v\n%s", err, *b)
	}
	if req.Method != "POST" || req.RequestURI != "/v1/chat/completions?x=1" || req.Host != "127.0.0.1:8000" || req.ContentLength != 42 {
		t.Fatalf("request line/host/length: %s %s %s %d", req.Method, req.RequestURI, req.Host, req.ContentLength)
	}
	if req.Header.Get("Authorization") != "Bearer k" || len(req.Header["X-Multi"]) != 2 {
		t.Errorf("end-to-end headers lost: %v", req.Header)
	}
	for _, k := range []string{"Connection", "X-Drop", "Accept-Encoding", "Expect", "X-Kvmesh-Hop", "Keep-Alive", "X-Evil", "Injected"} {
		if _, ok := req.Header[k]; ok {
			t.Errorf("%s forwarded", k)
		}
	}
	if bytes.Contains(*b, []byte("Bad Name")) {
		t.Error("an invalid header name was forwarded")
	}
}

func TestSplitHTTPURL(t *testing.T) {
	for _, tc := range []struct {
		url, host, path string
		ok              bool
	}{
		{"http://127.0.0.1:8000/v1/chat/completions", "127.0.0.1:8000", "/v1/chat/completions", true},
		{"HTTP://h/v1/x?a=b", "h", "/v1/x?a=b", true},
		{"http://h?a=b", "h", "/?a=b", true},
		{"http://h", "h", "/", true},
		{"http://[::1]:9/p", "[::1]:9", "/p", true},
		{"https://h/p", "", "", false},
		{"http:///p", "", "", false},
		{"http://user@h/p", "", "", false},
		{"http://h/p#frag", "", "", false},
		{"http://h/a b", "", "", false},
	} {
		host, path, ok := splitHTTPURL(tc.url)
		if host != tc.host || path != tc.path || ok != tc.ok {
			t.Errorf("%s: %q %q %v, want %q %q %v", tc.url, host, path, ok, tc.host, tc.path, tc.ok)
		}
	}
	if dialAddr("h") != "h:80" || dialAddr("h:9") != "h:9" || dialAddr("[::1]") != "[::1]:80" {
		t.Error("default port")
	}
}

// rawServer answers each request on a connection with the next of
// answers (in order over all connections), and counts connections.
type rawServer struct {
	ln    net.Listener
	conns atomic.Int32
	mu    sync.Mutex
	next  int
	open  []net.Conn // guarded by mu: closed at the test's end
	wg    sync.WaitGroup
}

func newRawServer(t *testing.T, answers ...string) *rawServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			s.mu.Lock()
			s.open = append(s.open, c)
			s.mu.Unlock()
			s.wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if _, err := io.Copy(io.Discard, req.Body); err != nil {
						return
					}
					s.mu.Lock()
					a := answers[s.next%len(answers)]
					s.next++
					s.mu.Unlock()
					if a == "" { // close without answering
						return
					}
					if _, err := io.WriteString(c, a); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		// Its connections too: one a client keeps open (a test that
		// failed before closing its pool) holds its reader otherwise.
		ln.Close()
		s.mu.Lock()
		for _, c := range s.open {
			c.Close()
		}
		s.mu.Unlock()
		waitGroup(t, &s.wg, "the raw server's connections")
	})
	return s
}

// TestUpstreamClientReuse: a connection is reused only after a body read
// to the end on a keep-alive response.
func TestUpstreamClientReuse(t *testing.T) {
	const ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	const chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
	const closing = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
	for _, tc := range []struct {
		name      string
		answers   []string
		readAll   []bool // per request: read the body to the end before closing
		wantConns int32
	}{
		{"keep-alive reused", []string{ok, chunked, ok}, []bool{true, true, true}, 1},
		{"unread body not reused", []string{ok, ok}, []bool{false, true}, 2},
		{"close not reused", []string{closing, ok}, []bool{true, true}, 2},
	} {
		s := newRawServer(t, tc.answers...)
		u := New(NewClient())
		for i, all := range tc.readAll {
			resp, err := u.Do(context.Background(), "http://"+s.ln.Addr().String()+"/v1/x", http.Header{}, []byte("{}"))
			if err != nil {
				t.Fatalf("%s: request %d: %v", tc.name, i, err)
			}
			if all {
				if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "ok" {
					t.Fatalf("%s: request %d body %q %v", tc.name, i, b, err)
				}
			}
			resp.Body.Close()
		}
		if got := s.conns.Load(); got != tc.wantConns {
			t.Errorf("%s: %d connections, want %d", tc.name, got, tc.wantConns)
		}
		// After closeIdle the next request needs a new connection.
		u.CloseIdle()
		resp, err := u.Do(context.Background(), "http://"+s.ln.Addr().String()+"/v1/x", http.Header{}, []byte("{}"))
		if err != nil {
			t.Fatalf("%s: after closeIdle: %v", tc.name, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := s.conns.Load(); got != tc.wantConns+1 {
			t.Errorf("%s: %d connections after closeIdle, want %d", tc.name, got, tc.wantConns+1)
		}
		u.CloseIdle()
	}
}

// TestUpstreamClientSkipsClosedIdle: a pooled connection its server
// closed after answering (a replica that exited, or closed it for
// idleness) is not used for the next request, however soon it comes: that
// request goes out on a new connection instead of failing after it looked
// written.
func TestUpstreamClientSkipsClosedIdle(t *testing.T) {
	ln, closed, conns := newClosingServer(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	u := New(NewClient())
	defer u.CloseIdle()
	for i := range 3 {
		resp, err := u.Do(context.Background(), "http://"+ln.Addr().String()+"/v1/x", http.Header{}, []byte("{}"))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "ok" {
			t.Fatalf("request %d body %q %v", i, b, err)
		}
		resp.Body.Close()
		recv(t, closed, "the server's close") // its FIN is on its way back before the next request
	}
	if got := conns.Load(); got != 3 {
		t.Fatalf("%d connections, want 3 (one per request)", got)
	}
}

// newClosingServer serves answer once on each connection it accepts, as
// a keep-alive server would, then closes the connection and tells closed
// (buffered past the tests' connections: a send never blocks it); conns
// counts the connections.
func newClosingServer(t *testing.T, answer string) (ln net.Listener, closed chan struct{}, conns *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed, conns = make(chan struct{}, 16), new(atomic.Int32)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			wg.Go(func() {
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err == nil {
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = io.WriteString(c, answer)
				}
				c.Close() // keep-alive promised, then closed
				closed <- struct{}{}
			})
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln, closed, conns
}

// TestUpstreamClientCancel: a cancelled request ends its blocked read.
func TestUpstreamClientCancel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	u := New(NewClient())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := u.Do(ctx, "http://"+ln.Addr().String()+"/v1/x", http.Header{}, []byte("{}"))
		done <- err
	}()
	c := recv(t, accepted, "the accepted connection")
	defer c.Close()
	cancel()
	if err := recv(t, done, "the cancelled request"); err == nil {
		t.Fatal("a cancelled request returned a response")
	}
}

// FuzzUpstreamResponse reads arbitrary bytes as a replica's response:
// the client never panics or loops, a length-framed body is exactly its
// length, and a status is a three-digit final one.
func FuzzUpstreamResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"), uint8(0))
	f.Add([]byte("HTTP/1.1 103 Early Hints\r\nX-Kvmesh-Dispatched: 1\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nT: 1\r\n\r\n"), uint8(2))
	f.Add([]byte("HTTP/1.0 200 OK\n\nbody until close"), uint8(1))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 3\r\n\r\n1\r\na\r\n0\r\n\r\n"), uint8(7))
	f.Fuzz(func(t *testing.T, raw []byte, step uint8) {
		resp, body, _, err := readScripted(string(raw), int(step))
		if resp == nil {
			return
		}
		if resp.StatusCode < 200 || resp.StatusCode > 999 {
			t.Fatalf("status %d returned as final", resp.StatusCode)
		}
		if err == nil && resp.ContentLength >= 0 && int64(len(body)) != resp.ContentLength {
			t.Fatalf("body of %d bytes for Content-Length %d", len(body), resp.ContentLength)
		}
	})
}

// TestParseResponseHeadHeaders: the header fields of a head parse as
// net/http parses them (repeated fields in order, keys canonical, values
// trimmed), values sharing one string of the head.
func TestParseResponseHeadHeaders(t *testing.T) {
	heads := []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n",
		"HTTP/1.1 200 OK\r\nset-cookie: a=1\r\nX-A:  x \t\r\nSet-Cookie: b=2\r\nx-a: y\r\ndate: now\r\n\r\n",
		"HTTP/1.0 404 Not Found\nServer: s\n\n",
		"HTTP/1.1 204 No Content\r\n\r\n",
	}
	for _, h := range heads {
		got, err := parseResponseHead([]byte(h))
		if err != nil {
			t.Fatalf("%q: %v", h, err)
		}
		want, err := http.ReadResponse(bufio.NewReader(strings.NewReader(h)), nil)
		if err != nil {
			t.Fatalf("%q: net/http: %v", h, err)
		}
		if got.StatusCode != want.StatusCode || got.Status != want.Status || got.Proto != want.Proto {
			t.Errorf("%q: status %d %q %q, net/http %d %q %q", h, got.StatusCode, got.Status, got.Proto, want.StatusCode, want.Status, want.Proto)
		}
		if !reflect.DeepEqual(got.Header, want.Header) {
			t.Errorf("%q: header %v, net/http %v", h, got.Header, want.Header)
		}
	}
}
