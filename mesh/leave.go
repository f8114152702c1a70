package mesh

import (
	"math"
	"time"

	"github.com/hashicorp/memberlist"
)

// Leaving (issue 24, "shutdown that orchestrators read as success").
// memberlist's Leave queues this router's own dead message and waits for
// it to be gossiped its retransmit limit of times. When every router
// stops at once, the others leave too while it waits: memberlist gossips
// to no router that left, so the message never goes out and Leave waits
// for its whole timeout, then fails. A leave nobody hears is no failure
// of this router: the peers that stay learn it from failure detection
// instead. So the wait is bounded by the time the broadcast needs when
// peers do listen, and its end, heard or not, is logged, never returned.

// leaveWait is how long the leave broadcast needs when the peers listen:
// memberlist sends each queued message to at most GossipNodes peers per
// gossip round until it was sent RetransmitMult·⌈log10(n+1)⌉ times
// (n the routers), plus two rounds of slack for the round in progress and
// a loaded machine.
func leaveWait(interval time.Duration, peers int) time.Duration {
	if peers <= 0 {
		return 0
	}
	c := memberlist.DefaultLANConfig()
	limit := c.RetransmitMult * int(math.Ceil(math.Log10(float64(peers+2))))
	perRound := min(c.GossipNodes, peers)
	rounds := (limit + perRound - 1) / perRound
	return time.Duration(rounds+2) * interval
}

// alivePeers counts the other routers memberlist holds alive.
func (m *Mesh) alivePeers() int {
	n := 0
	for _, node := range m.ml.Members() {
		if node.Name != m.cfg.Name {
			n++
		}
	}
	return n
}

// leave announces this router's departure and waits for the
// announcement to go out, at most timeout: first in memberlist's Leave,
// for leaveWait (which returns as soon as the broadcast is out); then,
// when it is not and peers are still alive (a loaded machine), for as
// long again while memberlist goes on gossiping it, unless no peer is
// left to hear it. Not hearing it out is logged (info when no peer is
// left, warn otherwise) and is not an error.
func (m *Mesh) leave(timeout time.Duration) {
	start := time.Now()
	deadline := start.Add(timeout)
	peers := m.alivePeers()
	wait := leaveWait(m.cfg.Timing.GossipInterval, peers)
	err := m.ml.Leave(max(min(timeout, wait), time.Millisecond))
	if err != nil {
		// The message stays queued until Shutdown: give it the time
		// again, polled, unless every peer is gone or going.
		until := time.Now().Add(wait)
		if until.After(deadline) {
			until = deadline
		}
		for m.alivePeers() > 0 && time.Now().Before(until) {
			time.Sleep(min(m.cfg.Timing.GossipInterval, time.Until(until)))
		}
	}
	took := time.Since(start).Round(time.Millisecond)
	switch left := m.alivePeers(); {
	case err == nil:
		m.log.Info("left the mesh", "peers", peers, "took", took)
	case left == 0:
		m.log.Info("left the mesh; no peer is left to hear it (they are leaving too)", "took", took)
	default:
		m.log.Warn("left the mesh without its leave broadcast confirmed; the peers will find this router gone by failure detection",
			"peers", left, "waited", took, "error", err)
	}
}
