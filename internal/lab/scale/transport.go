package scale

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Network is an in-memory network for memberlist transports, with a fixed
// one-way latency and a packet loss rate. Streams (memberlist's TCP) are
// net.Pipe pairs whose dial costs one latency and which lose nothing.
type Network struct {
	Latency time.Duration
	Loss    float64

	mu     sync.RWMutex
	byAddr map[string]*Transport
	port   int
	rng    *rand.Rand
	rngMu  sync.Mutex
}

// NewNetwork returns an empty network.
func NewNetwork(latency time.Duration, loss float64, seed uint64) *Network {
	return &Network{Latency: latency, Loss: loss, byAddr: map[string]*Transport{}, rng: rand.New(rand.NewPCG(seed, 77))}
}

// Transport is one router's end of the Network; it counts the bytes it
// sends and receives (memberlist's framing included).
type Transport struct {
	net      *Network
	addr     string
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	done     chan struct{}
	once     sync.Once

	// In and Out count bytes received and sent, packets and streams.
	In, Out atomic.Int64
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// NewTransport adds a transport with a fresh address.
func (n *Network) NewTransport() *Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.port++
	t := &Transport{net: n, addr: "10.0.0.1:" + strconv.Itoa(n.port), packetCh: make(chan *memberlist.Packet, 4096),
		streamCh: make(chan net.Conn, 256), done: make(chan struct{})}
	n.byAddr[t.addr] = t
	return t
}

// Addr is the transport's address, for joining.
func (t *Transport) Addr() string { return t.addr }

func (n *Network) lose() bool {
	if n.Loss <= 0 {
		return false
	}
	n.rngMu.Lock()
	defer n.rngMu.Unlock()
	return n.rng.Float64() < n.Loss
}

func (n *Network) peer(addr string) (*Transport, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	t := n.byAddr[addr]
	if t == nil {
		return nil, fmt.Errorf("no route to %s", addr)
	}
	return t, nil
}

// FinalAdvertiseAddr returns the transport's address.
func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	host, port, _ := net.SplitHostPort(t.addr)
	p, _ := strconv.Atoi(port)
	return net.ParseIP(host), p, nil
}

// WriteTo sends a packet.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress sends a packet after the latency, unless it is lost.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	dest, err := t.net.peer(a.Addr)
	if err != nil {
		return now, err
	}
	t.Out.Add(int64(len(b)))
	if t.net.lose() {
		return now, nil
	}
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: addr(t.addr), Timestamp: now}
	deliver := func() {
		select {
		case <-dest.done:
		case dest.packetCh <- p:
			dest.In.Add(int64(len(b)))
		default: // a full socket buffer drops, as UDP does
		}
	}
	if t.net.Latency > 0 {
		time.AfterFunc(t.net.Latency, deliver)
	} else {
		deliver()
	}
	return now, nil
}

// PacketCh delivers packets.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout opens a stream.
func (t *Transport) DialTimeout(a string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: a}, timeout)
}

// DialAddressTimeout opens a stream after one latency (the handshake).
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest, err := t.net.peer(a.Addr)
	if err != nil {
		return nil, err
	}
	if t.net.Latency > 0 {
		time.Sleep(t.net.Latency)
	}
	p1, p2 := net.Pipe()
	select {
	case dest.streamCh <- &countConn{Conn: p1, in: &dest.In, out: &dest.Out}:
	case <-dest.done:
		return nil, errors.New("connection refused")
	case <-time.After(timeout):
		return nil, errors.New("dial timeout")
	}
	return &countConn{Conn: p2, in: &t.In, out: &t.Out}, nil
}

// StreamCh delivers accepted streams.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown stops delivery to the transport.
func (t *Transport) Shutdown() error {
	t.once.Do(func() { close(t.done) })
	return nil
}

type addr string

func (a addr) Network() string { return "mem" }
func (a addr) String() string  { return string(a) }

// countConn counts a stream's bytes.
type countConn struct {
	net.Conn
	in, out *atomic.Int64
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}
