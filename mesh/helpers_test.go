package mesh

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer collects a router's log lines for assertions.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type testRouter struct {
	*Mesh
	logs *syncBuffer
	reg  *prometheus.Registry
}

// newRouter starts a router on 127.0.0.1 with test timings; it is closed
// when the test ends, and its log is printed if the test failed.
func newRouter(t testing.TB, name string, mod func(*Config)) *testRouter {
	t.Helper()
	logs := &syncBuffer{}
	reg := prometheus.NewPedanticRegistry()
	cfg := Config{
		Name: name, Region: "r1", APIAddr: "http://" + name + ".test", BindAddr: "127.0.0.1:0",
		Contract: summary.DefaultContract(), DefaultCapacityBlocks: 4096, Timing: TestTiming(),
		Logger:     hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Info, Output: logs}),
		Registerer: reg,
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", name, err)
	}
	tr := &testRouter{Mesh: m, logs: logs, reg: reg}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_ = m.Close(ctx)
		if t.Failed() {
			t.Logf("--- log of %s ---\n%s", name, logs.String())
		}
	})
	return tr
}

func joining(seeds ...*testRouter) func(*Config) {
	return func(c *Config) {
		for _, s := range seeds {
			c.Join = append(c.Join, s.GossipAddr())
		}
	}
}

// eventually polls f until it returns nil, failing after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func chain(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = seed*1_000_003 + uint64(i) + 1
	}
	return out
}

func candidate(m *Mesh, model, id string) (route.Candidate, bool) {
	for _, c := range m.Candidates(model, nil) {
		if c.ID() == id {
			return c, true
		}
	}
	return route.Candidate{}, false
}

// matches reports an error unless m's candidate id counts and matches
// all of hashes.
func matches(m *Mesh, id string, hashes []uint64) error {
	c, ok := candidate(m, "m", id)
	if !ok {
		return fmt.Errorf("%s: %s is not a candidate", m.cfg.Name, id)
	}
	if c.Summary == nil {
		return fmt.Errorf("%s: %s has no summary that counts (stale=%v)", m.cfg.Name, id, c.Stale)
	}
	if got := c.Summary.Match(summary.MakeProbes(nil, hashes)); got != len(hashes) {
		return fmt.Errorf("%s: %s matches %d of %d blocks", m.cfg.Name, id, got, len(hashes))
	}
	return nil
}

func members(m *Mesh) int {
	n := 0
	for _, mb := range m.Members() {
		if mb.State == "alive" {
			n++
		}
	}
	return n
}

// partitioner cuts traffic between groups of gossip addresses.
type partitioner struct {
	mu    sync.RWMutex
	group map[string]int
	cut   bool
}

func (p *partitioner) isCut(from, to string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.cut && p.group[from] != p.group[to]
}

func (p *partitioner) set(cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.mu.Unlock()
}

// partTransport drops packets and refuses dials across the cut, like a
// real partition (go-libraries.md §1.13).
type partTransport struct {
	*memberlist.NetTransport
	self string
	p    *partitioner
}

func (t *partTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.p.isCut(t.self, a.Addr) {
		return time.Now(), nil
	}
	return t.NetTransport.WriteToAddress(b, a)
}

func (t *partTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *partTransport) DialAddressTimeout(a memberlist.Address, to time.Duration) (net.Conn, error) {
	if t.p.isCut(t.self, a.Addr) {
		return nil, errors.New("partitioned")
	}
	return t.NetTransport.DialAddressTimeout(a, to)
}

func (t *partTransport) DialTimeout(addr string, to time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, to)
}

func (p *partitioner) transport(t testing.TB, group int) (*partTransport, string) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", nt.GetAutoBindPort())
	p.mu.Lock()
	if p.group == nil {
		p.group = map[string]int{}
	}
	p.group[addr] = group
	p.mu.Unlock()
	return &partTransport{NetTransport: nt, self: addr, p: p}, addr
}

func hasLine(logs *syncBuffer, parts ...string) bool {
	for _, line := range strings.Split(logs.String(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return true
		}
	}
	return false
}
