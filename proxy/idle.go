package proxy

import (
	"net"
	"time"

	"github.com/kvmesh/kvmesh/proxy/upstream"
)

// DefaultUpstreamIdleTimeout bounds how long an upstream may send no byte
// of a response body once its headers arrived (nginx's proxy_read_timeout
// has the same meaning and default). An LLM engine sends a non-streamed
// answer whole right after its headers (it computes before it answers, a
// wait the response header timeout bounds), and a stream a token every
// few milliseconds to seconds, so a minute of silence mid-body means a
// dead or unreachable upstream (a blackholed connection), which TCP
// keepalive would notice only after minutes. Until the first body byte
// the bound is the longer upstream.HeaderTimeout: an engine sends a
// stream's headers at once, and its first token only after the request
// waited in its queue and was prefilled, which under load takes minutes.
const DefaultUpstreamIdleTimeout = 60 * time.Second

// hopIdleSlack is added to the idle timeout of a hop (a peer router
// relaying its replica's response). Routers share the timeout, and a
// replica's silence is a silence of its owner's relay too: on equal
// timeouts the entry's watch and the owner's would fire within
// microseconds of each other, and whichever won would end the stream.
// The owner's cut is the one worth having: it reports its replica's
// failure to its health checker, counts it where the replica is, and
// ends the stream with its error event, which the entry relays. So the
// entry waits a second longer, time for the owner's event to cross the
// network; a dead or cut-off owner is still cut off, a second later.
const hopIdleSlack = time.Second

// watchIdle starts the watch of a response whose headers just arrived;
// nil when there is no timeout. hop adds hopIdleSlack. stop must be
// called when the relay ends.
func (p *Proxy) watchIdle(conn net.Conn, kill func(), hop bool) *upstream.IdleWatch {
	d := p.cfg.UpstreamIdleTimeout
	if d <= 0 {
		return nil
	}
	if hop {
		d += hopIdleSlack
	}
	return upstream.WatchIdle(conn, kill, d)
}
