package quota

import (
	"strings"
	"testing"
	"time"
)

// FuzzMergeGossip: no gossip makes a merge panic or hold more than the
// bounds; what a ledger encodes its peer decodes to the same usage.
func FuzzMergeGossip(f *testing.F) {
	c := newClock()
	a, _ := New(Config{Default: Limit{Input: 1e6, Output: 1e6}, Now: c.now, WireTenants: 3})
	for i := uint64(1); i < 6; i++ {
		tk, _ := a.Reserve(i, int64(i*100), int64(i))
		a.Settle(tk, int64(i*50), int64(i*3))
	}
	f.Add(a.AppendGossip(nil, c.now()), uint16(0))
	f.Add([]byte{1, 0x88, 0x27, 12, 0, 0, 0}, uint16(3))
	f.Add([]byte{}, uint16(9))
	f.Fuzz(func(t *testing.T, b []byte, skew uint16) {
		now := c.now().Add(time.Duration(skew) * time.Second)
		l, _ := New(Config{Default: Limit{Input: 1e6}, Now: func() time.Time { return now }})
		u, derr := decodeUsage(b)
		err := l.MergeGossip("p", 1, b, now)
		if derr != nil && err == nil {
			t.Fatal("merged what does not decode")
		}
		if err != nil {
			return
		}
		if len(u.tenants) > maxWireTenants {
			t.Fatalf("%d tenants decoded", len(u.tenants))
		}
		p := l.peers[peerID{"p", 1}]
		if len(p.tenants) > maxPeerTenants {
			t.Fatalf("%d tenants held", len(p.tenants))
		}
		for _, cells := range p.tenants {
			if len(cells) != l.ring {
				t.Fatal("cells not a ring")
			}
		}
		// Merging again changes nothing.
		before := l.Status(maxWireTenants)
		if err := l.MergeGossip("p", 1, b, now); err != nil {
			t.Fatal(err)
		}
		after := l.Status(maxWireTenants)
		if len(before.Tenants) != len(after.Tenants) {
			t.Fatal("a repeated merge changed the tenants")
		}
	})
}

// FuzzParseFile: a budgets file is parsed or refused, never misread.
func FuzzParseFile(f *testing.F) {
	f.Add("* 100 50\nteam 1000 - # c\n")
	f.Add("a 1 2\na 3 4")
	f.Fuzz(func(t *testing.T, s string) {
		def, ts, err := ParseFile(strings.NewReader(s))
		if err != nil {
			return
		}
		if def != nil && (def.Input < 0 || def.Output < 0) {
			t.Fatal("negative default")
		}
		for name, l := range ts {
			if name == "" || name == DefaultName || l.Input < 0 || l.Output < 0 || strings.ContainsAny(name, " \t#") {
				t.Fatalf("tenant %q %+v", name, l)
			}
		}
	})
}
