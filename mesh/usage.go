package mesh

import (
	"encoding/binary"
	"errors"
	"time"
)

// DefaultUsageInterval is how often a router gossips its tenants' token
// usage: each router may take its share of a tenant's headroom once per
// interval (package quota), so a shorter one lets a tenant's burst
// through sooner, for a stream to every peer each time.
const DefaultUsageInterval = time.Second

// Usage is what the mesh carries for the tenants' token budgets (package
// quota implements it): a payload the mesh does not read, from this
// router to each peer that decodes kindUsage (wireUsage or later: an
// older router is sent nothing and counts its own tenants alone), and
// the peers' payloads, handed over as they arrive.
type Usage interface {
	// AppendGossip appends this router's usage at now.
	AppendGossip(dst []byte, now time.Time) []byte
	// MergeGossip merges a peer's usage (origin, boot: its incarnation);
	// an error drops it and is counted.
	MergeGossip(origin string, boot uint64, b []byte, now time.Time) error
}

// usageLoop gossips the usage every UsageInterval: one encoding, put in
// each live peer's usage slot (peers.go), where a newer one replaces one
// not yet sent (each carries every live count, so the newest suffices).
func (d *dissemination) usageLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.UsageInterval)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case now := <-t.C:
			d.offerUsage(now)
		}
	}
}

// offerUsage encodes this router's usage and hands it to each peer that
// reads it.
func (d *dissemination) offerUsage(now time.Time) {
	msg := usageMsg{Origin: d.cfg.Name, Boot: d.boot, Payload: d.cfg.Usage.AppendGossip(nil, now)}
	if len(msg.Payload) > maxUsageBytes {
		d.log.Warn("tenant usage over its bound; not sent", "bytes", len(msg.Payload))
		return
	}
	b := msg.append(nil)
	d.tab.mu.RLock()
	defer d.tab.mu.RUnlock()
	for _, p := range d.peers {
		p.mu.Lock()
		ok := p.wire >= wireUsage
		if ok {
			p.usage = b
		}
		p.mu.Unlock()
		if !ok {
			continue
		}
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// handleUsage merges a peer's usage.
func (c *replication) handleUsage(u usageMsg) {
	if c.cfg.Usage == nil || u.Origin == c.cfg.Name {
		return
	}
	if err := c.cfg.Usage.MergeGossip(u.Origin, u.Boot, u.Payload, time.Now()); err != nil {
		c.met.dropped.WithLabelValues(dropDecode).Inc()
		c.log.Debug("tenant usage refused", "from", u.Origin, "error", err)
	}
}

// usageMsg is a router's tenant usage: the payload is Config.Usage's,
// opaque to the mesh.
type usageMsg struct {
	Origin  string
	Boot    uint64
	Payload []byte
}

func (u usageMsg) append(dst []byte) []byte {
	dst = append(dst, kindUsage)
	dst = appendS8(dst, u.Origin)
	dst = binary.BigEndian.AppendUint64(dst, u.Boot)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(u.Payload)))
	return append(dst, u.Payload...)
}

// maxUsageBytes bounds a usage payload (a few KB in practice).
const maxUsageBytes = 1 << 20

func (r *reader) usage() usageMsg {
	u := usageMsg{Origin: r.s8(), Boot: r.u64()}
	u.Payload = r.bytes32(maxUsageBytes)
	if r.err == nil && u.Origin == "" {
		r.fail(errors.New("empty origin"))
	}
	return u
}
