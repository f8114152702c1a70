package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func TestPubSub(t *testing.T) {
	defer goleak.VerifyNone(t)
	pub := Publish(listen(t), Limits{})
	defer pub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, pub.Addr().String(), Sub, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.PeerType() != Pub {
		t.Fatalf("peer type %q", c.PeerType())
	}
	if err := c.Subscribe("kv"); err != nil {
		t.Fatal(err)
	}
	for pub.Subscribers() == 0 {
		time.Sleep(time.Millisecond)
	}
	big := bytes.Repeat([]byte{7}, 1000) // a long frame
	pub.Send([]byte("other"), []byte("x"))
	pub.Send([]byte("kv-events"), []byte{0, 0, 0, 0, 0, 0, 0, 1}, big)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	m, err := c.ReadMsg(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 3 || string(m[0]) != "kv-events" || !bytes.Equal(m[2], big) {
		t.Fatalf("got %q", m)
	}
}

func TestDealerRouter(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := Answer(listen(t), Limits{}, func(req [][]byte) [][][]byte {
		return [][][]byte{{[]byte{}, req[1]}, {[]byte{}, []byte("end")}}
	})
	defer srv.Close()
	c, err := Dial(context.Background(), srv.Addr().String(), Dealer, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteMsg([]byte{}, []byte("seq")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"seq", "end"} {
		m, err := c.ReadMsg(nil)
		if err != nil || len(m) != 2 || string(m[1]) != want {
			t.Fatalf("got %q, %v; want %q", m, err, want)
		}
	}
}

func TestWrongPeerTypeRefused(t *testing.T) {
	defer goleak.VerifyNone(t)
	srv := Answer(listen(t), Limits{}, func([][]byte) [][][]byte { return nil })
	defer srv.Close()
	if _, err := Dial(context.Background(), srv.Addr().String(), Sub, Limits{}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("SUB to ROUTER: %v, want a protocol error", err)
	}
}

func TestSilentPeerTimesOut(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln := listen(t)
	defer ln.Close()
	done := make(chan struct{})
	go func() { // accepts and stays silent until the dialer gives up
		defer close(done)
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1024)) // the dialer's greeting
			_, _ = c.Read(make([]byte, 1))    // until it hangs up
		}
	}()
	defer func() { <-done }()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Dial(ctx, ln.Addr().String(), Sub, Limits{}); err == nil {
		t.Fatal("a silent peer completed a handshake")
	}
}

// conn reads frames from b as if a handshake had been done.
func conn(b []byte, lim Limits) *Conn {
	return &Conn{r: bufio.NewReader(bytes.NewReader(b)), lim: lim.withDefaults()}
}

func TestLimits(t *testing.T) {
	long := appendFrame(nil, 0, make([]byte, 300))
	if _, err := conn(long, Limits{MaxFrame: 299}).ReadMsg(nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("frame over the limit: %v", err)
	}
	// A length of 2^63 is refused before anything is allocated.
	huge := append([]byte{flagLong}, 0x80, 0, 0, 0, 0, 0, 0, 0)
	if _, err := conn(huge, Limits{}).ReadMsg(nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("huge frame: %v", err)
	}
	var many []byte
	for range 5 {
		many = appendFrame(many, flagMore, []byte("x"))
	}
	many = appendFrame(many, 0, []byte("x"))
	if _, err := conn(many, Limits{MaxFrames: 4}).ReadMsg(nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too many frames: %v", err)
	}
	if m, err := conn(many, Limits{}).ReadMsg(nil); err != nil || len(m) != 6 {
		t.Fatalf("6 frames: %d, %v", len(m), err)
	}
	// A command between messages is skipped (a 3.1 peer's PING).
	ping := appendFrame(nil, flagCommand, append([]byte{4}, "PING"...))
	if m, err := conn(append(ping, appendFrame(nil, 0, []byte("m"))...), Limits{}).ReadMsg(nil); err != nil || string(m[0]) != "m" {
		t.Fatalf("after a PING: %q, %v", m, err)
	}
}

func TestProperties(t *testing.T) {
	cmd := readyCommand(map[string]string{"Socket-Type": "SUB", "Identity": ""})
	name, body, err := ParseCommand(cmd)
	if err != nil || name != "READY" {
		t.Fatal(name, err)
	}
	p, err := ParseProperties(body)
	if err != nil || p["socket-type"] != "SUB" || len(p) != 2 {
		t.Fatal(p, err)
	}
	if _, err := ParseProperties(body[:len(body)-1]); err == nil {
		t.Fatal("a truncated property parsed")
	}
}

// FuzzReadMsg: whatever a peer sends after the handshake, ReadMsg returns
// messages within the limits or an error, and never more than it read.
func FuzzReadMsg(f *testing.F) {
	f.Add(appendFrame(appendFrame(nil, flagMore, []byte("kv-events")), 0, []byte{1, 2, 3}))
	f.Add(appendFrame(nil, flagCommand, append([]byte{5}, "ERROR"...)))
	f.Add([]byte{flagLong, 0, 0, 0, 0, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		c := conn(b, Limits{MaxFrame: 4096, MaxFrames: 8})
		total := 0
		for range 1000 {
			m, err := c.ReadMsg(nil)
			if err != nil {
				return
			}
			if len(m) > 8 {
				t.Fatalf("%d frames", len(m))
			}
			for _, fr := range m {
				if len(fr) > 4096 {
					t.Fatalf("frame of %d", len(fr))
				}
				total += len(fr)
			}
			if total > len(b) {
				t.Fatalf("read %d bytes of frames from %d", total, len(b))
			}
		}
	})
}

// FuzzHandshakeParts: greetings and READY metadata from a peer parse or
// fail cleanly.
func FuzzHandshakeParts(f *testing.F) {
	f.Add(greeting(true))
	f.Add(readyCommand(map[string]string{"Socket-Type": "PUB"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = checkGreeting(b)
		if name, body, err := ParseCommand(b); err == nil {
			if len(name)+len(body) >= len(b) {
				t.Fatal("command parts overrun")
			}
			_, _ = ParseProperties(body)
		}
	})
}
