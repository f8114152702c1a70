package proxy

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// sockIO is a TCP socket's raw reads and writes (sockio.go).
type sockIO struct {
	c  net.Conn // for the addresses of errors
	rc syscall.RawConn
	r  rawOp
	w  rawOp
	// peekFn is idle's call, under r's mutex.
	peekFn func(fd uintptr) bool
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

func newPlatformSockIO(c net.Conn) *sockIO {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &sockIO{c: c, rc: rc}
	s.r.fn = s.readOnce
	s.w.fn = s.writeAll
	s.peekFn = s.peek
	return s
}

// idle peeks at an idle socket (idleOpen) without a closure per call.
func (s *sockIO) idle() bool {
	o := &s.r
	o.mu.Lock()
	o.n = 0
	err := s.rc.Read(s.peekFn)
	ok := err == nil && o.n == 1
	o.mu.Unlock()
	return ok
}

func (s *sockIO) peek(fd uintptr) bool {
	if idleOpen(fd) {
		s.r.n = 1
	}
	return true
}

// Read is net.Conn's Read: one read that returns what the socket holds,
// waiting in the poller (deadlines included) while it holds nothing.
func (s *sockIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	o := &s.r
	o.mu.Lock()
	o.b, o.n, o.err = p, 0, nil
	err := s.rc.Read(o.fn)
	n := o.n
	if err == nil {
		err = o.err
	}
	o.b, o.err = nil, nil
	o.mu.Unlock()
	if err != nil && err != io.EOF {
		return n, s.opError("read", err)
	}
	return n, err
}

func (s *sockIO) readOnce(fd uintptr) bool {
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
func (s *sockIO) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	o := &s.w
	o.mu.Lock()
	o.b, o.n, o.err = p, 0, nil
	err := s.rc.Write(o.fn)
	n := o.n
	if err == nil {
		err = o.err
	}
	o.b, o.err = nil, nil
	o.mu.Unlock()
	if err != nil {
		return n, s.opError("write", err)
	}
	return n, nil
}

func (s *sockIO) writeAll(fd uintptr) bool {
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
func (s *sockIO) opError(op string, err error) error {
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
