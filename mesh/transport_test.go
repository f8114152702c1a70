package mesh

import (
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/internal/metricsum"
	"github.com/prometheus/client_golang/prometheus"
)

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestGossipStreamFloodBounded is issue 8 item 3: connections without the
// key announcing 20 MB encrypted frames made memberlist buffer every
// byte sent before failing to decrypt (60 took a router to 2.2 GB). The
// guard admits streams only within its memory budget and closes the rest
// before memberlist reads them; a keyed peer still joins.
//
// The budget (48 MB) holds one 20 MB frame's charge (40 MB) at a time,
// so the bound is asserted as such: every stream is decided, the most
// ever charged at once stays within the budget, and every stream not
// admitted was refused for the budget. How many are admitted is not
// asserted: an admitted stream gives its charge back when memberlist
// drops it (TCPTimeout, 1 s in TestTiming), so a test descheduled for
// longer than that mid-flood sees a later stream admitted as it should
// be (a floor on the refusals would fail on a busy machine). The
// heap bound is coarse (60 unguarded streams buffer 60 MB here).
func TestGossipStreamFloodBounded(t *testing.T) {
	key := []byte("0123456789abcdef")
	const budget = 48 << 20
	a := newRouter(t, "a", func(c *Config) { c.SecretKey = key; c.Streams = StreamLimits{BudgetBytes: budget} })
	before := heapInUse()
	const conns, sent = 60, 1 << 20
	junk := make([]byte, sent)
	var wg sync.WaitGroup
	var open []net.Conn
	for range conns {
		c, err := net.Dial("tcp", a.GossipAddr())
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			hdr := []byte{mlEncryptMsg, 0, 0, 0, 0}
			binary.BigEndian.PutUint32(hdr[1:], 20<<20)
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(hdr); err == nil {
				_, _ = c.Write(junk) // refused streams fail here
			}
		}()
	}
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	wg.Wait()
	grew := int64(heapInUse()) - int64(before)
	t.Logf("heap grew by %.1f MB with %d streams announcing 20 MB and sending 1 MB", float64(grew)/(1<<20), conns)
	if grew > 16<<20 {
		t.Fatalf("heap grew by %d MB", grew>>20)
	}
	// A write deadline can end a writer before the router read its
	// stream's head: wait (a bounded poll) until every stream is decided.
	var admitted, peak int64
	eventually(t, 20*time.Second, "every stream decided", func() error {
		a.mem.guard.mu.Lock()
		admitted, peak = a.mem.guard.admitted, a.mem.guard.peak
		a.mem.guard.mu.Unlock()
		if refused := int64(refusedStreams(t, a)); admitted+refused != conns {
			return fmt.Errorf("%d admitted, %d refused", admitted, refused)
		}
		return nil
	})
	t.Logf("%d of %d streams admitted, at most %.1f MB charged at once", admitted, conns, float64(peak)/(1<<20))
	if admitted < 1 || peak > budget {
		t.Fatalf("%d admitted, peak charge %d bytes over the budget %d", admitted, peak, budget)
	}
	if got := refusedFor(t, a, refuseBudget); got != conns-float64(admitted) {
		t.Errorf("%v streams refused for the budget, want %d", got, conns-admitted)
	}
	for _, c := range open {
		c.Close()
	}
	// A router with the key still joins once the flood is gone.
	b := newRouter(t, "b", func(c *Config) { c.SecretKey = key; c.Join = []string{a.GossipAddr()} })
	eventually(t, 20*time.Second, "b joins a", func() error {
		if n := b.ml.NumMembers(); n != 2 {
			return fmt.Errorf("%d members", n)
		}
		return nil
	})
}

// TestGossipStreamCap: streams over MaxStreams are closed unread.
func TestGossipStreamCap(t *testing.T) {
	a := newRouter(t, "a", func(c *Config) { c.Streams = StreamLimits{MaxStreams: 2} })
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for range 5 {
		c, err := net.Dial("tcp", a.GossipAddr())
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	eventually(t, 10*time.Second, "3 streams refused", func() error {
		if got := refusedStreams(t, a); got != 3 {
			return fmt.Errorf("%v refused", got)
		}
		return nil
	})
}

func refusedStreams(t *testing.T, r *testRouter) float64 { return refusedFor(t, r, "") }

// refusedFor counts streams refused for reason ("": for any reason).
func refusedFor(t *testing.T, r *testRouter, reason string) float64 {
	t.Helper()
	return metricsum.Counter(t, r.reg, "kvmesh_gossip_streams_refused_total", metricsum.AnyValue(reason))
}

// FuzzStreamHead feeds the guard arbitrary stream heads in arbitrary
// pieces: it never panics, never admits a frame over memberlist's limit,
// and gives back every byte of budget it charged.
func FuzzStreamHead(f *testing.F) {
	f.Add([]byte{mlEncryptMsg, 0, 0, 0, 16, 1, 2, 3}, uint8(3), true)
	f.Add([]byte{mlEncryptMsg, 0xff, 0xff, 0xff, 0xff}, uint8(1), true)
	f.Add([]byte{mlHasLabelMsg, 3, 'a', 'b', 'c', mlEncryptMsg, 0, 1, 0, 0}, uint8(2), true)
	f.Add([]byte{6, 0x83, 0xa5}, uint8(1), false)
	f.Add([]byte{0, 1, 2}, uint8(7), false)
	f.Add([]byte{mlHasLabelMsg}, uint8(1), false)
	f.Fuzz(func(t *testing.T, head []byte, piece uint8, encrypted bool) {
		if len(head) == 0 {
			return
		}
		g := &guardedTransport{lim: StreamLimits{MaxStreams: 1, BudgetBytes: 64 << 20}, encrypted: encrypted,
			slots: make(chan struct{}, 1), logf: func(string, ...any) {}}
		g.slots <- struct{}{}
		c := &guardedConn{t: g}
		step := int(piece%16) + 1
		for i := 0; i < len(head) && !c.decided; i += step {
			c.head = append(c.head, head[i:min(i+step, len(head))]...)
			if len(c.head) > 512 {
				c.head = c.head[:512]
			}
			if c.decide() != "" {
				break
			}
		}
		if c.decided {
			if c.limit > 2*mlMaxStateBytes+512 || c.charge <= 0 || g.used != c.charge {
				t.Fatalf("decided: limit %d charge %d used %d", c.limit, c.charge, g.used)
			}
			c.once.Do(func() { g.release(c.charge); <-g.slots })
		}
		if g.used != 0 {
			t.Fatalf("budget %d left charged", g.used)
		}
	})
}

// TestJunkPacketsLogThrottled is issue 8 item 10's last part: memberlist
// logs one ERROR line per junk gossip packet, so a flood of them would
// flood the log; a burst per second passes and the rest is counted.
func TestJunkPacketsLogThrottled(t *testing.T) {
	a := newRouter(t, "a", func(c *Config) { c.SecretKey = []byte("0123456789abcdef") })
	c, err := net.Dial("udp", a.GossipAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 500 {
		_, _ = c.Write([]byte(fmt.Sprintf("junk packet %d that is not encrypted", i)))
	}
	// Every packet is read (memberlist's packet counter is not exported,
	// so wait for the log to go quiet: a bounded poll, not a timing).
	lines := func() int { return strings.Count(a.logs.String(), "memberlist") }
	eventually(t, 10*time.Second, "memberlist to log the junk", func() error {
		if lines() == 0 {
			return fmt.Errorf("no log line yet")
		}
		return nil
	})
	prev := -1
	eventually(t, 10*time.Second, "the log to settle", func() error {
		n := lines()
		if n != prev {
			prev = n
			time.Sleep(200 * time.Millisecond)
			return fmt.Errorf("%d lines", n)
		}
		return nil
	})
	if n := lines(); n > 60 {
		t.Fatalf("%d memberlist log lines for 500 junk packets", n)
	}
}

// TestGuardedTransportShutdownWithLateStream: a stream the inner transport
// accepts after the pump stopped handing streams on must not hold its
// Shutdown (its listener blocks on an unbuffered send until someone takes
// the stream).
func TestGuardedTransportShutdownWithLateStream(t *testing.T) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, BindPort: 0})
	if err != nil {
		t.Fatal(err)
	}
	tr := newGuardedTransport(nt, StreamLimits{}, false, prometheus.NewRegistry(), func(string, ...any) {})
	tr.stopOnce.Do(func() { close(tr.done) }) // Shutdown's first step
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(nt.GetAutoBindPort()))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(50 * time.Millisecond) // the inner listener accepts it and offers it
	done := make(chan error, 1)
	go func() { done <- tr.Shutdown() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown hangs on a stream accepted after the pump stopped")
	}
}
