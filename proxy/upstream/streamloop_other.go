//go:build !linux

package upstream

import (
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// Loops: the stream loop is Linux's (streamloop_linux.go); elsewhere
// every stream takes the normal path.
type Loops struct{}

// NewLoops returns no loops: every stream takes the normal path.
func NewLoops(_, _ prometheus.Counter, _ func(string, any)) *Loops { return nil }

// Relay takes no stream.
func (*Loops) Relay(*http.Request, *Body, *net.TCPConn, func([]byte), <-chan struct{}, *Framing) (res LoopResult, pending, held []byte, err error) {
	return LoopNotTaken, nil, nil, nil
}

// Close has nothing to stop.
func (*Loops) Close() {}

func (c *upConn) loopRead([]byte) (int, error) { return 0, errAgain }
