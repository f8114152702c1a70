//go:build !linux

package proxy

import (
	"net"
	"net/http"
)

// streamLoops: the stream loop is Linux's (streamloop_linux.go); elsewhere
// every stream takes the normal path.
type streamLoops struct{}

func newStreamLoops(*metrics, func(string, any)) *streamLoops { return nil }

func (*streamLoops) relay(*http.Request, *upBody, *net.TCPConn, func([]byte), <-chan struct{}, *eventFraming) (res loopResult, pending, held []byte, err error) {
	return loopNotTaken, nil, nil, nil
}

func (*streamLoops) close() {}

func (c *upConn) loopRead([]byte) (int, error) { return 0, errAgain }
