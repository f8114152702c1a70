package mesh

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// deadlineTransport gives every stream memberlist dials a deadline.
// memberlist's SendReliable writes without one: to a peer that accepts
// and then stops reading (stopped, wedged, or an in-memory pipe whose
// reader is gone) a large batch would block the peer's sender forever, and
// Close with it. memberlist sets its own deadlines where it has them
// (push/pull); they replace this one.
type deadlineTransport struct {
	memberlist.NodeAwareTransport
	timeout time.Duration
}

func (t *deadlineTransport) DialAddressTimeout(a memberlist.Address, to time.Duration) (net.Conn, error) {
	c, err := t.NodeAwareTransport.DialAddressTimeout(a, to)
	if err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Now().Add(t.timeout)); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("mesh: stream deadline: %w", err)
	}
	return c, nil
}

func (t *deadlineTransport) DialTimeout(addr string, to time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, to)
}

// transport returns the configured transport, or memberlist's network
// transport on mc's bind address (as memberlist would create it, dynamic
// port included), wrapped with stream deadlines.
func (m *Mesh) transport(mc *memberlist.Config) (memberlist.NodeAwareTransport, error) {
	var tr memberlist.NodeAwareTransport = m.cfg.Transport
	if tr == nil {
		nc := &memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger}
		var nt *memberlist.NetTransport
		var err error
		// A dynamic port is bound for UDP and TCP separately: retry a
		// race with another process, as memberlist does.
		for range 10 {
			if nt, err = memberlist.NewNetTransport(nc); err == nil || mc.BindPort != 0 || !strings.Contains(err.Error(), "address already in use") {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("mesh: gossip transport on %s:%d: %w", mc.BindAddr, mc.BindPort, err)
		}
		if mc.BindPort == 0 {
			mc.BindPort = nt.GetAutoBindPort()
			mc.AdvertisePort = mc.BindPort
		}
		tr = nt
	}
	return &deadlineTransport{NodeAwareTransport: tr, timeout: m.cfg.Timing.TCPTimeout}, nil
}
