package mesh

import (
	"fmt"
	"net"
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

// withDeadlines wraps mc's transport (guarded, or the configured one)
// with stream deadlines.
func (b *membership) withDeadlines(mc *memberlist.Config) {
	if nat, ok := mc.Transport.(memberlist.NodeAwareTransport); ok {
		mc.Transport = &deadlineTransport{NodeAwareTransport: nat, timeout: b.cfg.Timing.TCPTimeout}
	}
}
