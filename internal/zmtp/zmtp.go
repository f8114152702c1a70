// Package zmtp speaks the ZeroMQ wire protocol (ZMTP 3.0, NULL security)
// over TCP, as much of it as a router needs to read an engine's KV-cache
// events: a SUB socket (and a PUB for tests and the replica simulator) and
// a DEALER for the replay endpoint (and the ROUTER side of it).
//
// Why not a ZMQ library: the maintained pure-Go one (go-zeromq/zmq4
// v0.17.0) allocates every frame at the length its peer announces
// (`make([]byte, size)` up to 2^63), takes no deadline on the handshake,
// and its per-connection reader can block for ever on a full queue after
// Close. A router must bound what a peer can make it hold and own its
// goroutines, so this package does the little ZMTP needs here itself:
// the greeting, the READY command, framed messages with a cap on frame
// size and frames per message, and deadlines everywhere. One connection
// is one Conn; there is no socket-level fan-in, reconnection or queueing
// (callers own those, with their own bounds).
package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// Socket types this package speaks, and whom each may talk to.
const (
	Pub    = "PUB"
	Sub    = "SUB"
	Dealer = "DEALER"
	Router = "ROUTER"
)

func peerOK(self, peer string) bool {
	switch self {
	case Sub:
		return peer == Pub || peer == "XPUB"
	case Pub:
		return peer == Sub || peer == "XSUB"
	case Dealer:
		return peer == Router || peer == Dealer
	case Router:
		return peer == Dealer || peer == "REQ" || peer == Router
	}
	return false
}

// Limits bound what one peer can make a Conn hold.
type Limits struct {
	// MaxFrame is the largest frame accepted (default 16 MiB).
	MaxFrame int
	// MaxFrames is the most frames of one message (default 16).
	MaxFrames int
}

func (l Limits) withDefaults() Limits {
	if l.MaxFrame <= 0 {
		l.MaxFrame = 16 << 20
	}
	if l.MaxFrames <= 0 {
		l.MaxFrames = 16
	}
	return l
}

// Errors a peer's bytes can cause.
var (
	ErrProtocol = errors.New("zmtp: protocol error")
	ErrTooLarge = errors.New("zmtp: message over the limit")
)

const (
	greetingLen = 64
	flagMore    = 1
	flagLong    = 2
	flagCommand = 4
)

// greeting is ZMTP 3.0's 64-byte greeting with the NULL mechanism.
func greeting(server bool) []byte {
	g := make([]byte, greetingLen)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	if server {
		g[32] = 1
	}
	return g
}

// checkGreeting validates a peer's greeting: the signature, version 3 or
// later (a later minor version talks 3.0 to a 3.0 peer) and NULL security.
func checkGreeting(g []byte) error {
	if len(g) != greetingLen || g[0] != 0xff || g[9]&1 != 1 {
		return fmt.Errorf("%w: bad signature", ErrProtocol)
	}
	if g[10] < 3 {
		return fmt.Errorf("%w: peer speaks ZMTP %d.%d, need 3.x", ErrProtocol, g[10], g[11])
	}
	mech := string(bytes.TrimRight(g[12:32], "\x00"))
	if mech != "NULL" {
		return fmt.Errorf("%w: security mechanism %q, only NULL is supported", ErrProtocol, mech)
	}
	return nil
}

// readyCommand is the body of a READY command with these properties.
func readyCommand(props map[string]string) []byte {
	b := append([]byte{5}, "READY"...)
	for _, k := range sortedKeys(props) {
		v := props[k]
		b = append(b, byte(len(k)))
		b = append(b, k...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	for i := 1; i < len(ks); i++ { // a handful of keys
		for j := i; j > 0 && ks[j] < ks[j-1]; j-- {
			ks[j], ks[j-1] = ks[j-1], ks[j]
		}
	}
	return ks
}

// ParseCommand splits a command frame into its name and body.
func ParseCommand(b []byte) (name string, body []byte, err error) {
	if len(b) < 1 || int(b[0]) > len(b)-1 {
		return "", nil, fmt.Errorf("%w: short command", ErrProtocol)
	}
	return string(b[1 : 1+b[0]]), b[1+b[0]:], nil
}

// ParseProperties decodes a READY command's metadata.
func ParseProperties(b []byte) (map[string]string, error) {
	props := map[string]string{}
	for len(b) > 0 {
		n := int(b[0])
		if n == 0 || len(b) < 1+n+4 {
			return nil, fmt.Errorf("%w: bad property", ErrProtocol)
		}
		name := string(b[1 : 1+n])
		b = b[1+n:]
		vl := binary.BigEndian.Uint32(b)
		b = b[4:]
		if uint64(vl) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: property %q overruns", ErrProtocol, name)
		}
		props[strings.ToLower(name)] = string(b[:vl])
		b = b[vl:]
	}
	return props, nil
}

// Conn is one ZMTP connection after its handshake. Reads and writes may
// run concurrently with each other (one reader, one writer at a time).
type Conn struct {
	nc       net.Conn
	r        *bufio.Reader
	lim      Limits
	peerType string
}

// Dial connects to addr ("host:port") as a socket of type self and does
// the handshake within ctx's deadline (or 5 s).
func Dial(ctx context.Context, addr, self string, lim Limits) (*Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c, err := Handshake(ctx, nc, self, false, lim)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// Handshake runs the greeting and READY exchange on nc as a socket of
// type self. The caller closes nc on error.
func Handshake(ctx context.Context, nc net.Conn, self string, server bool, lim Limits) (*Conn, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Second)
	}
	_ = nc.SetDeadline(deadline)
	c := &Conn{nc: nc, r: bufio.NewReaderSize(nc, 64<<10), lim: lim.withDefaults()}
	if _, err := nc.Write(greeting(server)); err != nil {
		return nil, err
	}
	g := make([]byte, greetingLen)
	if _, err := io.ReadFull(c.r, g); err != nil {
		return nil, fmt.Errorf("zmtp: reading greeting: %w", err)
	}
	if err := checkGreeting(g); err != nil {
		return nil, err
	}
	if err := c.writeFrame(flagCommand, readyCommand(map[string]string{"Socket-Type": self})); err != nil {
		return nil, err
	}
	frames, cmd, err := c.read(nil, 1<<10)
	if err != nil {
		return nil, fmt.Errorf("zmtp: reading READY: %w", err)
	}
	if !cmd || len(frames) != 1 {
		return nil, fmt.Errorf("%w: expected READY", ErrProtocol)
	}
	name, body, err := ParseCommand(frames[0])
	if err != nil {
		return nil, err
	}
	if name == "ERROR" {
		return nil, fmt.Errorf("%w: peer refused: %q", ErrProtocol, body)
	}
	if name != "READY" {
		return nil, fmt.Errorf("%w: expected READY, got %q", ErrProtocol, name)
	}
	props, err := ParseProperties(body)
	if err != nil {
		return nil, err
	}
	c.peerType = props["socket-type"]
	if !peerOK(self, c.peerType) {
		return nil, fmt.Errorf("%w: a %s cannot talk to a %s", ErrProtocol, self, c.peerType)
	}
	_ = nc.SetDeadline(time.Time{})
	return c, nil
}

// PeerType is the peer's socket type.
func (c *Conn) PeerType() string { return c.peerType }

// Close closes the connection; a blocked read or write returns.
func (c *Conn) Close() error { return c.nc.Close() }

// SetReadDeadline bounds the next reads.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.nc.SetReadDeadline(t) }

// SetWriteDeadline bounds the next writes.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.nc.SetWriteDeadline(t) }

// ReadMsg reads the next message's frames (commands from the peer, such
// as a 3.1 PING, are skipped). Frames are appended to dst[:0] and are
// fresh slices the caller keeps.
func (c *Conn) ReadMsg(dst [][]byte) ([][]byte, error) {
	for {
		frames, cmd, err := c.read(dst[:0], c.lim.MaxFrame)
		if err != nil {
			return nil, err
		}
		if !cmd {
			return frames, nil
		}
		if name, body, err := ParseCommand(frames[0]); err == nil && name == "ERROR" {
			return nil, fmt.Errorf("%w: peer error: %q", ErrProtocol, body)
		}
	}
}

// read reads one message or command. A frame over maxFrame, or a message
// of more than MaxFrames frames, is an error before its body is read.
func (c *Conn) read(dst [][]byte, maxFrame int) (frames [][]byte, cmd bool, err error) {
	frames = dst
	for {
		flags, err := c.r.ReadByte()
		if err != nil {
			return nil, false, err
		}
		if flags&^(flagMore|flagLong|flagCommand) != 0 {
			return nil, false, fmt.Errorf("%w: reserved flag bits %#x", ErrProtocol, flags)
		}
		var size uint64
		if flags&flagLong != 0 {
			var b [8]byte
			if _, err := io.ReadFull(c.r, b[:]); err != nil {
				return nil, false, err
			}
			size = binary.BigEndian.Uint64(b[:])
		} else {
			s, err := c.r.ReadByte()
			if err != nil {
				return nil, false, err
			}
			size = uint64(s)
		}
		if size > uint64(maxFrame) {
			return nil, false, fmt.Errorf("%w: frame of %d bytes (limit %d)", ErrTooLarge, size, maxFrame)
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(c.r, body); err != nil {
			return nil, false, err
		}
		if flags&flagCommand != 0 {
			if flags&flagMore != 0 || len(frames) > 0 {
				return nil, false, fmt.Errorf("%w: command inside a message", ErrProtocol)
			}
			return append(frames, body), true, nil
		}
		frames = append(frames, body)
		if flags&flagMore == 0 {
			return frames, false, nil
		}
		if len(frames) >= c.lim.MaxFrames {
			return nil, false, fmt.Errorf("%w: more than %d frames", ErrTooLarge, c.lim.MaxFrames)
		}
	}
}

// WriteMsg writes one message of these frames.
func (c *Conn) WriteMsg(frames ...[]byte) error {
	var buf []byte
	for i, f := range frames {
		var fl byte
		if i < len(frames)-1 {
			fl = flagMore
		}
		buf = appendFrame(buf, fl, f)
	}
	_, err := c.nc.Write(buf)
	return err
}

func (c *Conn) writeFrame(flags byte, body []byte) error {
	_, err := c.nc.Write(appendFrame(nil, flags, body))
	return err
}

func appendFrame(dst []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		dst = append(dst, flags|flagLong)
		dst = binary.BigEndian.AppendUint64(dst, uint64(len(body)))
	} else {
		dst = append(dst, flags, byte(len(body)))
	}
	return append(dst, body...)
}

// Subscribe sends a SUB's subscription to topic (a ZMTP 3.0 subscription
// message: 0x01 then the topic prefix; "" subscribes to everything).
func (c *Conn) Subscribe(topic string) error {
	return c.WriteMsg(append([]byte{1}, topic...))
}
