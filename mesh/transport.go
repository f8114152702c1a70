package mesh

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/internal/ratelog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// StreamLimits bound what inbound gossip TCP streams can make memberlist
// hold before it authenticates them. memberlist reads an encrypted stream
// whole into memory before decrypting it (net.go decryptRemoteState: a
// frame announces up to 20 MB and the bytes are buffered as they come),
// and it decodes a plain push/pull after allocating from the header's
// counts. The guard sees each stream's first bytes before memberlist
// does: it charges an encrypted frame twice its announced size (the
// buffer's doubling growth) against BudgetBytes and refuses the stream
// when the budget is spent, refuses frames announcing more than memberlist
// accepts, caps a stream's bytes at what it announced, and caps streams
// being read at once at MaxStreams. Refused streams are closed before
// memberlist buffers a byte of them.
type StreamLimits struct {
	// MaxStreams caps inbound streams being read at once (default 64).
	MaxStreams int
	// BudgetBytes caps the memory inbound streams may make memberlist
	// buffer at once (default 64 MB).
	BudgetBytes int64
}

// Defaults of StreamLimits.
const (
	DefaultMaxStreams  = 64
	DefaultStreamBytes = 64 << 20
)

// Stream framing of memberlist (net.go, label.go; part of its protocol).
const (
	mlEncryptMsg     = 10
	mlHasLabelMsg    = 244
	mlMaxStateBytes  = 20 << 20 // maxPushStateBytes
	smallStreamBytes = 64 << 10 // a TCP ping, a refusal, a small reliable message
	// plainStreamCost is charged for a plain push/pull, compressed or
	// reliable message: its real cost is known only after memberlist's
	// decoding, so a mesh without a key is bounded by stream count and
	// bytes only; give it a gossip key.
	plainStreamCost = 16 << 20
)

// Reasons of kvmesh_gossip_streams_refused_total.
const (
	refuseTooMany  = "too_many_streams"
	refuseBudget   = "memory_budget"
	refuseTooLarge = "frame_too_large"
	refuseOverrun  = "over_announced_size"
	refusePlain    = "plain_with_key"
)

// guardedTransport is memberlist's NetTransport with inbound streams
// passed through the guard.
type guardedTransport struct {
	*memberlist.NetTransport
	lim       StreamLimits
	encrypted bool
	streams   chan net.Conn
	slots     chan struct{}
	done      chan struct{} // closed by Shutdown: no more streams to memberlist
	innerDone chan struct{} // closed once the inner transport has shut down
	stopOnce  sync.Once
	wg        sync.WaitGroup
	refusedC  *prometheus.CounterVec
	logf      func(format string, args ...any)

	mu   sync.Mutex
	used int64
	// admitted and peak (the most ever charged at once) let a test
	// check the bound itself rather than how many streams a given
	// schedule happened to refuse.
	admitted int64
	peak     int64
}

// guardTransport gives memberlist a guarded NetTransport (or the test's
// Config.Transport as is) and rate-limits memberlist's log, which logs
// one line per junk packet or refused stream.
func (b *membership) guardTransport(mc *memberlist.Config) error {
	if mc.Logger != nil {
		lg := b.cfg.Logger
		dropped := func(line []byte) bool { // memberlist's debug lines, below an info logger
			return lg != nil && !lg.IsDebug() && bytes.Contains(line, []byte("[DEBUG]"))
		}
		mc.Logger = log.New(ratelog.Writer{W: mc.Logger.Writer(), L: ratelog.New(20, time.Second), Dropped: dropped}, mc.Logger.Prefix(), mc.Logger.Flags())
	}
	if b.cfg.Transport != nil {
		mc.Transport = b.cfg.Transport
		return nil
	}
	var nt *memberlist.NetTransport
	var err error
	// Binding port 0 on TCP and UDP at once can race; memberlist retries too.
	for range 10 {
		nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger})
		if err == nil || mc.BindPort != 0 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("mesh: gossip transport on %s:%d: %w", mc.BindAddr, mc.BindPort, err)
	}
	if mc.BindPort == 0 {
		mc.BindPort = nt.GetAutoBindPort()
		if b.cfg.AdvertiseAddr == "" {
			mc.AdvertisePort = mc.BindPort
		}
	}
	b.guard = newGuardedTransport(nt, b.cfg.Streams, len(mc.SecretKey) > 0, b.cfg.Registerer, mc.Logger.Printf)
	mc.Transport = b.guard
	return nil
}

func newGuardedTransport(nt *memberlist.NetTransport, lim StreamLimits, encrypted bool, reg prometheus.Registerer, logf func(string, ...any)) *guardedTransport {
	if lim.MaxStreams <= 0 {
		lim.MaxStreams = DefaultMaxStreams
	}
	if lim.BudgetBytes <= 0 {
		lim.BudgetBytes = DefaultStreamBytes
	}
	t := &guardedTransport{
		NetTransport: nt, lim: lim, encrypted: encrypted,
		streams: make(chan net.Conn), slots: make(chan struct{}, lim.MaxStreams), done: make(chan struct{}),
		innerDone: make(chan struct{}),
		refusedC: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_gossip_streams_refused_total",
			Help: "Inbound gossip TCP streams closed before memberlist read them, by reason.",
		}, []string{"reason"}),
		logf: logf,
	}
	t.wg.Add(1)
	go t.pump()
	return t
}

// StreamCh implements memberlist.Transport with the guarded streams.
func (t *guardedTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown implements memberlist.Transport. The pump stops handing
// streams to memberlist at once but keeps taking (and closing) what the
// inner transport accepts until that has shut down: its listener blocks
// on an unbuffered send, and a stream accepted in the last moment would
// otherwise hold its Shutdown for ever.
func (t *guardedTransport) Shutdown() error {
	t.stopOnce.Do(func() { close(t.done) })
	err := t.NetTransport.Shutdown()
	close(t.innerDone)
	t.wg.Wait()
	return err
}

// pump hands the inner transport's streams to memberlist while a slot is
// free and closes the rest at once.
func (t *guardedTransport) pump() {
	defer t.wg.Done()
	in := t.NetTransport.StreamCh()
	defer func() {
		for {
			select {
			case c := <-in:
				_ = c.Close()
			case <-t.innerDone:
				return
			}
		}
	}()
	for {
		var c net.Conn
		select {
		case c = <-in:
		case <-t.done:
			return
		}
		select {
		case t.slots <- struct{}{}:
		default:
			t.refuse(refuseTooMany, c)
			_ = c.Close()
			continue
		}
		g := &guardedConn{Conn: c, t: t}
		select {
		case t.streams <- g:
		case <-t.done:
			_ = g.Close()
			return
		}
	}
}

func (t *guardedTransport) refuse(reason string, c net.Conn) {
	t.refusedC.WithLabelValues(reason).Inc()
	t.logf("[WARN] mesh: refused gossip stream from %s: %s", c.RemoteAddr(), reason)
}

// reserve charges n bytes against the budget.
func (t *guardedTransport) reserve(n int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.used+n > t.lim.BudgetBytes {
		return false
	}
	t.used += n
	t.admitted++
	t.peak = max(t.peak, t.used)
	return true
}

func (t *guardedTransport) release(n int64) {
	t.mu.Lock()
	t.used -= n
	t.mu.Unlock()
}

var errStreamRefused = errors.New("gossip stream refused by the guard")

// guardedConn reads one inbound stream under the guard: its first bytes
// decide its charge and byte limit before memberlist sees them.
type guardedConn struct {
	net.Conn
	t       *guardedTransport
	head    []byte // the first bytes, until decided
	decided bool
	charge  int64
	limit   int64 // bytes the stream may carry in all
	read    int64
	err     error
	once    sync.Once
}

func (c *guardedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		if !c.decided {
			c.head = append(c.head, p[:min(n, 512-len(c.head))]...)
			if reason := c.decide(); reason != "" {
				c.t.refuse(reason, c.Conn)
				c.err = errStreamRefused
				return 0, c.err
			}
		}
		c.read += int64(n)
		if c.decided && c.read > c.limit {
			c.t.refuse(refuseOverrun, c.Conn)
			c.err = errStreamRefused
			return 0, c.err
		}
	}
	return n, err
}

// decide parses the stream head (optional label, message type, and an
// encrypted frame's length); it returns a refusal reason, or "" once
// decided or while more bytes are needed.
func (c *guardedConn) decide() string {
	h := c.head
	i := 0
	if h[0] == mlHasLabelMsg {
		if len(h) < 2 {
			return ""
		}
		i = 2 + int(h[1])
	}
	if len(h) <= i {
		if len(h) >= 512 {
			return refuseTooLarge
		}
		return ""
	}
	var charge, limit int64
	switch typ := h[i]; {
	case typ == mlEncryptMsg:
		if len(h) < i+5 {
			return ""
		}
		size := int64(binary.BigEndian.Uint32(h[i+1 : i+5]))
		if size > mlMaxStateBytes {
			return refuseTooLarge
		}
		charge, limit = 2*size+smallStreamBytes, int64(i)+5+size
	case c.t.encrypted:
		// memberlist refuses plain streams when it has a key; let it say so.
		charge, limit = smallStreamBytes, smallStreamBytes
	case typ == 0: // a TCP ping
		charge, limit = smallStreamBytes, smallStreamBytes
	default:
		charge, limit = plainStreamCost, 2*mlMaxStateBytes
	}
	if !c.t.reserve(charge) {
		return refuseBudget
	}
	c.decided, c.charge, c.limit, c.head = true, charge, limit, nil
	return ""
}

// Close gives the stream's slot and charge back, once.
func (c *guardedConn) Close() error {
	c.once.Do(func() {
		if c.decided {
			c.t.release(c.charge)
		}
		<-c.t.slots
	})
	return c.Conn.Close()
}
