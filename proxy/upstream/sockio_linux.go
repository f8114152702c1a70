package upstream

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// SockIO is a TCP socket's raw reads and writes (sockio.go).
type SockIO struct {
	c  net.Conn // for the addresses of errors
	rc syscall.RawConn
	r  rawOp
	w  rawOp
	// peekFn is idle's call, under r's mutex.
	peekFn func(fd uintptr) bool
	// writev's call and its second buffer (the first is w.b), under w's
	// mutex; iov is its vector (a field: on the stack it would escape).
	vfn func(fd uintptr) bool
	b2  []byte
	iov [2]syscall.Iovec
}

// rawOp is one direction's call in progress. Its function is made once
// per socket (a closure per call would be an allocation per call); the
// mutex keeps concurrent calls in one direction, which net.Conn allows,
// from sharing its state.
type rawOp struct {
	mu  sync.Mutex
	b   []byte
	n   int
	err error
	fn  func(fd uintptr) bool
}

func newPlatformSockIO(c net.Conn) *SockIO {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &SockIO{c: c, rc: rc}
	s.r.fn = s.readOnce
	s.w.fn = s.writeAll
	s.peekFn = s.peek
	s.vfn = s.writevAll
	return s
}

// writev writes a and then b in one call where the socket takes both
// (the upstream request's head and body, the body not copied).
func (s *SockIO) writev(a, b []byte) (int, error) {
	if len(a)+len(b) > maxRaw {
		bufs := net.Buffers{a, b}
		n, err := bufs.WriteTo(s.c)
		return int(n), err
	}
	o := &s.w
	o.mu.Lock()
	o.b, s.b2, o.n, o.err = a, b, 0, nil
	err := s.rc.Write(s.vfn)
	n := o.n
	if err == nil {
		err = o.err
	}
	o.b, s.b2, o.err = nil, nil, nil
	s.iov = [2]syscall.Iovec{} // no pointers into the caller's buffers kept
	o.mu.Unlock()
	if err != nil {
		return n, s.opError("write", err)
	}
	return n, nil
}

func (s *SockIO) writevAll(fd uintptr) bool {
	o := &s.w
	a, b := o.b, s.b2
	for o.n < len(a)+len(b) {
		cnt := 0
		if o.n < len(a) {
			s.iov[0].Base = &a[o.n]
			s.iov[0].SetLen(len(a) - o.n)
			cnt = 1
			if len(b) > 0 {
				s.iov[1].Base = &b[0]
				s.iov[1].SetLen(len(b))
				cnt = 2
			}
		} else {
			rest := b[o.n-len(a):]
			s.iov[0].Base = &rest[0]
			s.iov[0].SetLen(len(rest))
			cnt = 1
		}
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.iov[0])), uintptr(cnt))
		switch {
		case e == 0:
			o.n += int(r)
		case e == syscall.EINTR:
		case e == syscall.EAGAIN:
			return false
		default:
			o.err = os.NewSyscallError("writev", e)
			return true
		}
	}
	return true
}

// maxRaw bounds the bytes of one raw call: the call keeps its processor
// (nothing else runs there meanwhile, and a GC waits for it), which is
// right for the microseconds a request's head or an 8 KB body take, not
// for the milliseconds of copying megabytes. A longer read is cut short
// (Read may return less); a longer write goes through net.Conn.
const maxRaw = 64 << 10

// idle peeks at an idle socket (idleOpen) without a closure per call.
func (s *SockIO) idle() bool {
	o := &s.r
	o.mu.Lock()
	o.n = 0
	err := s.rc.Read(s.peekFn)
	ok := err == nil && o.n == 1
	o.mu.Unlock()
	return ok
}

func (s *SockIO) peek(fd uintptr) bool {
	if idleOpen(fd) {
		s.r.n = 1
	}
	return true
}

// Read is net.Conn's Read: one read that returns what the socket holds,
// waiting in the poller (deadlines included) while it holds nothing.
func (s *SockIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > maxRaw {
		p = p[:maxRaw]
	}
	n, err := s.call(&s.r, p, false)
	if err != nil && err != io.EOF {
		return n, s.opError("read", err)
	}
	return n, err
}

func (s *SockIO) readOnce(fd uintptr) bool {
	o := &s.r
	for {
		n, err := rawRead(int(fd), o.b)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return false
		case err != nil:
			o.err = os.NewSyscallError("read", err)
		case n == 0:
			o.err = io.EOF
		default:
			o.n = n
		}
		return true
	}
}

// Write is net.Conn's Write: all of p, waiting in the poller while the
// socket is full.
func (s *SockIO) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > maxRaw {
		return s.c.Write(p)
	}
	n, err := s.call(&s.w, p, true)
	if err != nil {
		return n, s.opError("write", err)
	}
	return n, nil
}

// call runs o's call over b in the poller (RawConn's Write or Read: it
// waits there while the call finds the socket not ready) and returns
// what the call moved and its error, the poller's first.
func (s *SockIO) call(o *rawOp, b []byte, write bool) (int, error) {
	o.mu.Lock()
	o.b, o.n, o.err = b, 0, nil
	var err error
	if write {
		err = s.rc.Write(o.fn)
	} else {
		err = s.rc.Read(o.fn)
	}
	n := o.n
	if err == nil {
		err = o.err
	}
	o.b, o.err = nil, nil
	o.mu.Unlock()
	return n, err
}

func (s *SockIO) writeAll(fd uintptr) bool {
	o := &s.w
	for o.n < len(o.b) {
		n, err := rawWrite(int(fd), o.b[o.n:])
		switch {
		case err == nil:
			o.n += n
		case err == syscall.EINTR:
		case err == syscall.EAGAIN:
			return false
		default:
			o.err = os.NewSyscallError("write", err)
			return true
		}
	}
	return true
}

// opError wraps err as net.Conn's methods do: net/http tells the read
// its abortPendingRead ended from a failure by net.Error's Timeout. The
// poller's errors (a deadline, a closed socket) come from RawConn as a
// *net.OpError already, named "raw-read" or "raw-write": renamed, not
// wrapped again (the aborted read is one per request).
func (s *SockIO) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		oe.Op = op
		return oe
	}
	return &net.OpError{Op: op, Net: "tcp", Source: s.c.LocalAddr(), Addr: s.c.RemoteAddr(), Err: err}
}

// idleChecks: pooled connections can be peeked at without blocking.
const idleChecks = true

// idleOpen peeks at an idle socket without blocking: true when nothing is
// there to read (the server neither closed it nor sent anything unasked).
// The call is raw (sockio.go): it is made once per pooled request.
func idleOpen(fd uintptr) bool {
	var b [1]byte
	_, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return e == syscall.EAGAIN
}
