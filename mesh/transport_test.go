package mesh

import (
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
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
// before memberlist reads them; a keyed peer still joins. The heap bound
// is coarse (60 unguarded streams buffer 60 MB here), not a timing.
func TestGossipStreamFloodBounded(t *testing.T) {
	key := []byte("0123456789abcdef")
	a := newRouter(t, "a", func(c *Config) { c.SecretKey = key; c.Streams = StreamLimits{BudgetBytes: 48 << 20} })
	before := heapInUse()
	const conns, sent = 60, 1 << 20
	junk := make([]byte, sent)
	var wg sync.WaitGroup
	var open []net.Conn
	var mu sync.Mutex
	for range conns {
		c, err := net.Dial("tcp", a.GossipAddr())
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		open = append(open, c)
		mu.Unlock()
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
	wg.Wait()
	grew := int64(heapInUse()) - int64(before)
	for _, c := range open {
		c.Close()
	}
	t.Logf("heap grew by %.1f MB with %d streams announcing 20 MB and sending 1 MB", float64(grew)/(1<<20), conns)
	if grew > 16<<20 {
		t.Fatalf("heap grew by %d MB", grew>>20)
	}
	if got := refusedStreams(t, a); got < conns-2 {
		t.Errorf("refused %v of %d streams", got, conns)
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

func refusedStreams(t *testing.T, r *testRouter) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_gossip_streams_refused_total" {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}
