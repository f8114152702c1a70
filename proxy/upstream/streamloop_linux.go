package upstream

import (
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/kvmesh/kvmesh/internal/panics"
	"github.com/prometheus/client_golang/prometheus"
)

// Loops are the router's stream loops (streamloop.go), started on
// the first stream: one per two cores (one on a small machine), so a
// token's work for many streams waits on one epoll_wait, while on a large
// machine the answer extraction of thousands of streams is not held to
// one core. A stream goes to the next loop in turn.
type Loops struct {
	// streams counts the streams taken, clientWaits those handed back
	// behind a full client socket.
	streams, clientWaits prometheus.Counter
	// recovered counts and logs a panic a loop recovered.
	recovered func(where string, v any)
	mu        sync.Mutex
	loops     []*streamLoop
	closed    bool
	next      atomic.Uint32
	stopped   sync.WaitGroup
}

// NewLoops returns the stream loops, started on their first stream.
// streams counts the streams they take, clientWaits those handed back
// because the client's socket was full; recovered counts and logs a
// panic a loop recovered.
func NewLoops(streams, clientWaits prometheus.Counter, recovered func(where string, v any)) *Loops {
	return &Loops{streams: streams, clientWaits: clientWaits, recovered: recovered}
}

// loopBuffer is the loop's read and frame buffer: a chunk's size line,
// up to this much data, and its CRLF.
const loopBuffer = 32 << 10

// streamLoop is one epoll loop and the streams it relays, all owned by
// its goroutine but for the queue.
type streamLoop struct {
	ls      *Loops
	epfd    int
	epf     *os.File // epfd in Go's poller: the loop waits there, not in a blocking epoll_wait
	epRaw   syscall.RawConn
	wakeR   int // the read end of the wake pipe, in the epoll set
	wakeW   int // its write end; -1 once closed (under mu)
	mu      sync.Mutex
	queue   []loopMsg
	closing bool
	// Owned by the loop's goroutine:
	streams map[int32]*loopStream // by the replica socket's descriptor
	buf     []byte
	// work is the queue drain took, done up to worked; cur is the
	// stream whose code runs. A panic there ends cur, and the loop
	// goes on with the rest of work (contain).
	work   []loopMsg
	worked int
	cur    *loopStream
}

// loopMsg asks the loop to take a stream, or (cancel) to drop one: its
// client went away, or (idle) its replica sent nothing for the upstream
// idle timeout.
type loopMsg struct {
	s      *loopStream
	cancel bool
	idle   bool
}

// loopStream is one stream in a loop.
type loopStream struct {
	body   *Body
	upFD   int // the replica socket (net/http's descriptor; the body's owner keeps it open)
	clFD   int // a duplicate of the client socket's descriptor, owned by the loop
	onData func([]byte)
	// frame follows the stream's SSE events (Framing); held is a
	// partial event read and held back until its end comes. The loop
	// owns both until done is closed, the handler after.
	frame Framing
	held  []byte
	// Set by the loop before done is closed:
	res     LoopResult
	err     error
	pending []byte
	done    chan struct{}
}

// Relay hands body to a loop, to be written to cc, and waits for it to
// come back: relayed to its end, failed, or handed back (with the bytes
// of a chunk cc did not take yet, and those of a partial event held back
// by fr, which the loop updates). onData sees every decoded piece of the
// body on the loop's goroutine, before it is written.
func (ls *Loops) Relay(r *http.Request, body *Body, cc *net.TCPConn, onData func([]byte), idle <-chan struct{}, fr *Framing) (res LoopResult, pending, held []byte, err error) {
	l := ls.pick()
	if l == nil {
		return LoopNotTaken, nil, nil, nil
	}
	upFD, ok := sockFD(upstreamTCPConn(body.c.nc), false)
	if !ok {
		return LoopNotTaken, nil, nil, nil
	}
	// The client's socket is written through a descriptor of the loop's
	// own: net/http may close its connection (Server.Close) while the
	// loop still holds the stream, and the number must not be reused
	// under it.
	clFD, ok := sockFD(cc, true)
	if !ok {
		return LoopNotTaken, nil, nil, nil
	}
	s := &loopStream{body: body, upFD: upFD, clFD: clFD, onData: onData, frame: *fr, done: make(chan struct{})}
	body.c.loopFD, body.c.loopReads, body.c.inLoop = upFD, 0, true
	if !l.send(loopMsg{s: s}) {
		body.c.inLoop = false
		_ = syscall.Close(clFD)
		return LoopNotTaken, nil, nil, nil
	}
	ls.streams.Inc()
	select {
	case <-s.done:
	case <-r.Context().Done():
		l.send(loopMsg{s: s, cancel: true})
		<-s.done
	case <-idle:
		// The upstream idle timeout (IdleWatch): the replica sent nothing.
		l.send(loopMsg{s: s, cancel: true, idle: true})
		<-s.done
	}
	body.c.inLoop = false
	if s.res == LoopHandback && len(s.pending) > 0 {
		ls.clientWaits.Inc()
	}
	*fr = s.frame // fr stays the handler's (on its stack): the loop had a copy
	return s.res, s.pending, s.held, s.err
}

// sockFD returns the descriptor of c, or a duplicate of it (close-on-exec).
func sockFD(c *net.TCPConn, dup bool) (int, bool) {
	if c == nil {
		return -1, false
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, false
	}
	fd, derr := -1, error(nil)
	if err := raw.Control(func(f uintptr) {
		if !dup {
			fd = int(f)
			return
		}
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, f, syscall.F_DUPFD_CLOEXEC, 0)
		if e != 0 {
			derr = e
			return
		}
		fd = int(r)
	}); err != nil || derr != nil {
		return -1, false
	}
	return fd, true
}

// pick returns the next loop, starting the loops on first use; nil once
// closed or when a loop cannot be made.
func (ls *Loops) pick() *streamLoop {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return nil
	}
	if ls.loops == nil {
		n := max(1, runtime.GOMAXPROCS(0)/2)
		for range n {
			l, err := newStreamLoop(ls)
			if err != nil {
				break
			}
			ls.loops = append(ls.loops, l)
			ls.stopped.Add(1)
			go l.run()
		}
		if len(ls.loops) == 0 {
			ls.closed = true // no epoll here: never again
			return nil
		}
	}
	return ls.loops[int(ls.next.Add(1))%len(ls.loops)]
}

// Close stops the loops and waits for them: the streams they hold go
// back to their handlers' goroutines, which finish them the normal way.
// Safe to call more than once.
func (ls *Loops) Close() {
	ls.mu.Lock()
	ls.closed = true
	loops := ls.loops
	ls.loops = nil // a second close has nothing to stop
	ls.mu.Unlock()
	for _, l := range loops {
		l.mu.Lock()
		l.closing = true
		l.wakeLocked()
		l.mu.Unlock()
	}
	ls.stopped.Wait()
}

func newStreamLoop(ls *Loops) (*streamLoop, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		_ = syscall.Close(epfd)
		return nil, os.NewSyscallError("pipe2", err)
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(p[0])}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, p[0], &ev); err != nil {
		_ = syscall.Close(epfd)
		_ = syscall.Close(p[0])
		_ = syscall.Close(p[1])
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	// The loop waits for its epoll set in Go's poller (the set's
	// descriptor is readable when a socket in it is): a goroutine
	// blocked in epoll_wait would hold a thread in a system call, whose
	// processor sysmon keeps taking back (waking every 20 µs to do so).
	if err := syscall.SetNonblock(epfd, true); err != nil {
		_ = syscall.Close(epfd)
		_ = syscall.Close(p[0])
		_ = syscall.Close(p[1])
		return nil, os.NewSyscallError("fcntl", err)
	}
	epf := os.NewFile(uintptr(epfd), "epoll")
	raw, err := epf.SyscallConn()
	if err != nil {
		_ = epf.Close()
		_ = syscall.Close(p[0])
		_ = syscall.Close(p[1])
		return nil, err
	}
	return &streamLoop{ls: ls, epfd: epfd, epf: epf, epRaw: raw, wakeR: p[0], wakeW: p[1], streams: map[int32]*loopStream{},
		buf: make([]byte, frameRoom+loopBuffer+2)}, nil
}

// send queues m for the loop; false once the loop is closing.
func (l *streamLoop) send(m loopMsg) bool {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return false
	}
	if len(l.queue) == 0 {
		l.wakeLocked()
	}
	l.queue = append(l.queue, m)
	l.mu.Unlock()
	return true
}

// wakeLocked wakes the loop; l.mu is held, so the pipe is still open.
func (l *streamLoop) wakeLocked() {
	if l.wakeW < 0 {
		return
	}
	for {
		_, err := syscall.Write(l.wakeW, []byte{1})
		if err != syscall.EINTR {
			return // EAGAIN: the pipe is full, a wake-up is pending anyway
		}
	}
}

// run is the loop's goroutine.
func (l *streamLoop) run() {
	defer l.ls.stopped.Done()
	events := make([]syscall.EpollEvent, 128)
	for !l.poll(events) {
	}
}

// poll serves the loop's sockets until the loop stops (true) or the code
// of a stream panics (false: that stream has ended, and run polls again;
// the readiness of the sockets not served yet is reported again, since
// the set is level-triggered, and the queue's rest is in work).
func (l *streamLoop) poll(events []syscall.EpollEvent) (stopped bool) {
	defer func() {
		if v := recover(); v != nil {
			stopped = l.contain(v)
		}
	}()
	if l.worked < len(l.work) && l.drain() {
		l.stop()
		return true
	}
	for {
		var n int
		var err error
		if rerr := l.epRaw.Read(func(fd uintptr) bool {
			n, err = epollPoll(int(fd), events)
			return n > 0 || (err != nil && err != syscall.EINTR)
		}); rerr != nil && err == nil {
			err = rerr
		}
		if err != nil {
			// Cannot happen with a valid set; hand everything back.
			l.mu.Lock()
			l.closing = true
			l.mu.Unlock()
			l.stop()
			return true
		}
		for i := range n {
			fd := events[i].Fd
			if fd == int32(l.wakeR) {
				if l.drain() {
					l.stop()
					return true
				}
				continue
			}
			if s := l.streams[fd]; s != nil {
				l.serve(s, 1)
			}
		}
	}
}

// contain ends the stream whose code panicked (LoopPanicked: its handler
// aborts the client's connection) and reports whether the loop stops: a
// panic outside any stream's code leaves the loop's own state in doubt,
// so the loop then hands every stream back and stops (the Proxy serves on
// without it, each stream by its handler's goroutine).
func (l *streamLoop) contain(v any) (stopped bool) {
	l.ls.recovered(panics.StreamLoop, v)
	s := l.cur
	l.cur = nil
	if s == nil {
		l.mu.Lock()
		l.closing = true
		l.mu.Unlock()
		l.stop()
		return true
	}
	s.pending = nil
	if l.streams[int32(s.upFD)] == s {
		l.finish(s, LoopPanicked, nil)
	} else {
		l.done(s, LoopPanicked, nil)
	}
	return false
}

// drain empties the wake pipe and the queue; true when the loop is to stop.
func (l *streamLoop) drain() bool {
	var b [64]byte
	for {
		n, err := syscall.Read(l.wakeR, b[:])
		if n <= 0 || err != nil {
			break
		}
	}
	l.mu.Lock()
	if l.worked == len(l.work) {
		// The slices swap: no allocation once both have grown.
		l.work, l.queue, l.worked = l.queue, l.work[:0], 0
	} else {
		l.work = append(l.work, l.queue...)
		clear(l.queue)
		l.queue = l.queue[:0]
	}
	closing := l.closing
	l.mu.Unlock()
	for l.worked < len(l.work) {
		m := l.work[l.worked]
		l.work[l.worked] = loopMsg{}
		l.worked++
		s := m.s
		l.cur = s
		if m.cancel {
			if l.streams[int32(s.upFD)] == s {
				if m.idle {
					l.finish(s, LoopFailed, errUpstreamIdle)
				} else {
					l.finish(s, LoopClientGone, nil)
				}
			}
			continue
		}
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(s.upFD)}
		if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, s.upFD, &ev); err != nil {
			l.done(s, LoopHandback, nil)
			continue
		}
		l.streams[int32(s.upFD)] = s
		// Bytes read with the head are in the buffer already.
		l.serve(s, 0)
	}
	l.cur = nil
	l.work, l.worked = l.work[:0], 0
	return closing
}

// stop hands every stream back and releases the loop's descriptors.
func (l *streamLoop) stop() {
	for _, s := range l.streams {
		l.finish(s, LoopHandback, nil)
	}
	l.mu.Lock()
	q := l.queue
	l.queue = nil
	_ = syscall.Close(l.wakeW)
	l.wakeW = -1
	l.mu.Unlock()
	for _, m := range append(l.work[l.worked:], q...) {
		if !m.cancel {
			l.done(m.s, LoopHandback, nil)
		}
	}
	l.work, l.worked = nil, 0
	_ = l.epf.Close()
	_ = syscall.Close(l.wakeR)
}

// serve relays what s's replica socket has: the buffered bytes and at
// most reads more reads of the socket.
func (l *streamLoop) serve(s *loopStream, reads int) {
	l.cur = s
	l.relay(s, reads)
	l.cur = nil
}

func (l *streamLoop) relay(s *loopStream, reads int) {
	s.body.c.loopReads = reads
	data := l.buf[frameRoom : frameRoom+loopBuffer]
	for {
		// data[:held] is the partial event held back (usually none).
		held := copy(data, s.held)
		n, err := s.body.Read(data[held:])
		if n > 0 {
			s.onData(data[held : held+n])
		}
		all := held + n
		k := all
		if err != io.EOF {
			k = s.frame.Cut(data[:all], held, all == len(data))
		}
		// Kept before the chunk's CRLF overwrites its first bytes.
		s.held = append(s.held[:0], data[k:all]...)
		if k > 0 {
			start := putChunkHead(l.buf[:frameRoom], k)
			end := frameRoom + k
			l.buf[end], l.buf[end+1] = '\r', '\n'
			if !l.write(s, l.buf[start:end+2]) {
				return
			}
		}
		switch {
		case err == nil:
		case err == errAgain:
			return
		case err == io.EOF:
			l.finish(s, LoopEOF, nil)
			return
		default:
			l.finish(s, LoopFailed, err)
			return
		}
	}
}

// write writes one chunk to the client's socket without blocking. When
// the socket is full the stream goes back to its goroutine with the rest.
func (l *streamLoop) write(s *loopStream, b []byte) bool {
	for len(b) > 0 {
		n, err := rawWrite(s.clFD, b)
		if n > 0 {
			b = b[n:]
		}
		switch {
		case err == nil, err == syscall.EINTR:
		case err == syscall.EAGAIN:
			s.pending = append([]byte(nil), b...)
			l.finish(s, LoopHandback, nil)
			return false
		default:
			l.finish(s, LoopClientGone, err)
			return false
		}
	}
	return true
}

// finish takes s out of the loop and gives it back.
func (l *streamLoop) finish(s *loopStream, res LoopResult, err error) {
	_ = syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_DEL, s.upFD, nil)
	delete(l.streams, int32(s.upFD))
	l.done(s, res, err)
}

func (l *streamLoop) done(s *loopStream, res LoopResult, err error) {
	select {
	case <-s.done:
		return // given back already (a panic after its end: contain)
	default:
	}
	_ = syscall.Close(s.clFD)
	s.body.c.loopReads = 0
	s.res, s.err = res, err
	close(s.done)
}

// loopRead is a read of the replica socket in the loop: non-blocking, and
// only while the loop allows one.
func (c *upConn) loopRead(b []byte) (int, error) {
	if c.loopReads <= 0 {
		return 0, errAgain
	}
	c.loopReads--
	for {
		n, err := rawRead(c.loopFD, b)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return 0, errAgain
		case err != nil:
			return 0, os.NewSyscallError("read", err)
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// The loop's system calls never block (its sockets are non-blocking and
// it polls with a zero timeout), so they are made raw: without the
// runtime's entersyscall and exitsyscall around them, which cost more
// than a loopback write and wake sysmon whenever the process was idle.

func rawRead(fd int, b []byte) (int, error) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func rawWrite(fd int, b []byte) (int, error) {
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// epollPoll is epoll_wait with a zero timeout (epoll_pwait without a
// signal mask, which every Linux architecture has).
func epollPoll(epfd int, events []syscall.EpollEvent) (int, error) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
