package quota

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
)

// The usage a router gossips: its own counts of every live bucket, for
// its heaviest tenants and the rest summed (doc.go, Agreeing).
//
//	usage  : version u8 (1) | bucket ms uvarint | buckets uvarint | current bucket uvarint
//	         | n uvarint × (tenant u64 | cells) | rest cells
//	cells  : m u8 × (age u8 | in+ uvarint | in- uvarint | out+ uvarint | out- uvarint)
//
// A cell's bucket is the current bucket less its age. The mesh frames it
// (its own message kind, sent only to routers that read it).
const gossipVersion = 1

// maxCount bounds a counter on the wire, so that sums over routers and
// buckets cannot overflow.
const maxCount = 1 << 50

// AppendGossip appends this router's usage at now to dst, and starts a
// new interval for the share rule (doc.go, Admitting).
func (l *Ledger) AppendGossip(dst []byte, now time.Time) []byte {
	cur := l.bucket(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(cur)
	for id, p := range l.peers {
		if now.Sub(p.heard) > 2*l.cfg.Window {
			delete(l.peers, id) // all its buckets have left the window
		}
	}
	type ranked struct {
		t   uint64
		s   *series
		use int64
	}
	all := make([]ranked, 0, len(l.own)+1)
	for t, s := range l.own {
		s.unseen = [2]int64{}
		all = append(all, ranked{t, s, l.sumCells(s.cells, 0, cur) + l.sumCells(s.cells, 1, cur)})
	}
	l.overflow.unseen = [2]int64{}
	slices.SortFunc(all, func(a, b ranked) int {
		switch {
		case a.use > b.use:
			return -1 // heaviest first
		case a.use < b.use:
			return 1
		}
		return cmpU64(a.t, b.t)
	})
	listed := all[:min(len(all), l.cfg.WireTenants)]
	rest := make([]cell, l.ring)
	addCells(rest, l.overflow.cells, l.ring)
	for _, r := range all[len(listed):] {
		addCells(rest, r.s.cells, l.ring)
	}
	dst = append(dst, gossipVersion)
	dst = binary.AppendUvarint(dst, uint64(l.bw/int64(time.Millisecond)))
	dst = binary.AppendUvarint(dst, uint64(l.cfg.Buckets))
	dst = binary.AppendUvarint(dst, uint64(max(cur, 0)))
	dst = binary.AppendUvarint(dst, uint64(len(listed)))
	for _, r := range listed {
		dst = binary.BigEndian.AppendUint64(dst, r.t)
		dst = l.appendCells(dst, r.s.cells, cur)
	}
	return l.appendCells(dst, rest, cur)
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// addCells adds src's cells into dst's of the same bucket.
func addCells(dst, src []cell, ring int) {
	for _, c := range src {
		if c.b == 0 {
			continue
		}
		d := &dst[c.b%int64(ring)]
		if d.b != c.b {
			*d = cell{b: c.b}
		}
		d.in.add += c.in.add
		d.in.sub += c.in.sub
		d.out.add += c.out.add
		d.out.sub += c.out.sub
	}
}

// appendCells appends the cells still in the ring at cur.
func (l *Ledger) appendCells(dst []byte, cells []cell, cur int64) []byte {
	at := len(dst)
	dst = append(dst, 0)
	m := 0
	for _, c := range cells {
		if age := cur - c.b; c.b == 0 || age < 0 || age >= int64(l.ring) {
			continue
		}
		m++
		dst = append(dst, byte(cur-c.b))
		for _, v := range [4]uint64{c.in.add, c.in.sub, c.out.add, c.out.sub} {
			dst = binary.AppendUvarint(dst, min(v, maxCount))
		}
	}
	dst[at] = byte(m)
	return dst
}

// usage is one decoded gossip.
type usage struct {
	bucketMs, buckets uint64
	cur               int64
	tenants           []tenantCells
	rest              []wireCell
}

type tenantCells struct {
	tenant uint64
	cells  []wireCell
}

type wireCell struct {
	age            uint8
	inAdd, inSub   uint64
	outAdd, outSub uint64
}

var errGossip = errors.New("quota gossip")

// decodeUsage decodes a gossip; every count and length is checked
// against the bytes held before it is used.
func decodeUsage(b []byte) (usage, error) {
	r := byteReader{b: b}
	var u usage
	if v := r.u8(); r.err == nil && v != gossipVersion {
		return u, fmt.Errorf("%w: version %d", errGossip, v)
	}
	u.bucketMs, u.buckets = r.uvarint(), r.uvarint()
	cur := r.uvarint()
	if cur > 1<<62 {
		r.fail("bucket out of range")
	}
	u.cur = int64(cur)
	n := r.uvarint()
	// A tenant takes at least 9 bytes.
	if r.err == nil && (n > maxWireTenants || n*9 > uint64(len(r.b))) {
		r.fail(fmt.Sprintf("%d tenants in %d bytes", n, len(r.b)))
	}
	for i := uint64(0); i < n && r.err == nil; i++ {
		t := tenantCells{tenant: r.u64()}
		t.cells = r.cells()
		u.tenants = append(u.tenants, t)
	}
	u.rest = r.cells()
	if r.err == nil && len(r.b) > 0 {
		r.fail(fmt.Sprintf("%d bytes after the usage", len(r.b)))
	}
	if r.err != nil {
		return usage{}, r.err
	}
	return u, nil
}

type byteReader struct {
	b   []byte
	err error
}

func (r *byteReader) fail(msg string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", errGossip, msg)
	}
}

func (r *byteReader) u8() byte {
	if r.err != nil || len(r.b) < 1 {
		r.fail("truncated")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *byteReader) u64() uint64 {
	if r.err != nil || len(r.b) < 8 {
		r.fail("truncated")
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *byteReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *byteReader) cells() []wireCell {
	m := int(r.u8())
	if r.err == nil && m*5 > len(r.b) {
		r.fail(fmt.Sprintf("%d cells in %d bytes", m, len(r.b)))
	}
	var out []wireCell
	for range m {
		if r.err != nil {
			return nil
		}
		c := wireCell{age: r.u8(), inAdd: r.uvarint(), inSub: r.uvarint(), outAdd: r.uvarint(), outSub: r.uvarint()}
		if c.inAdd > maxCount || c.inSub > maxCount || c.outAdd > maxCount || c.outSub > maxCount {
			r.fail("count out of range")
		}
		out = append(out, c)
	}
	return out
}

// MergeGossip merges a peer's usage, heard at now: per cell, the larger
// of each counter (doc.go, Agreeing). It refuses what it cannot decode,
// a peer counting another window, and a peer whose clock is more than a
// ring of buckets from this one's.
func (l *Ledger) MergeGossip(origin string, boot uint64, b []byte, now time.Time) error {
	u, err := decodeUsage(b)
	if err != nil {
		return err
	}
	if u.bucketMs != uint64(l.bw/int64(time.Millisecond)) || u.buckets != uint64(l.cfg.Buckets) {
		return fmt.Errorf("%w: peer %s counts %d buckets of %d ms, this router %d of %d ms", errGossip, origin,
			u.buckets, u.bucketMs, l.cfg.Buckets, l.bw/int64(time.Millisecond))
	}
	cur := l.bucket(now)
	if d := u.cur - cur; d > int64(l.ring) || d < -int64(l.ring) {
		return fmt.Errorf("%w: peer %s is %d buckets from this router's clock", errGossip, origin, d)
	}
	for _, t := range u.tenants {
		if err := l.checkCells(t.cells); err != nil {
			return err
		}
	}
	if err := l.checkCells(u.rest); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	id := peerID{origin, boot}
	p := l.peers[id]
	if p == nil {
		if len(l.peers) >= maxPeers {
			l.dropStalest()
		}
		p = &peer{tenants: map[uint64][]cell{}, rest: make([]cell, l.ring)}
		l.peers[id] = p
	}
	p.heard = now
	for t, cells := range p.tenants {
		if !l.live(cells, cur) {
			delete(p.tenants, t)
		}
	}
	for _, t := range u.tenants {
		cells := p.tenants[t.tenant]
		if cells == nil {
			if len(p.tenants) >= maxPeerTenants {
				continue
			}
			cells = make([]cell, l.ring)
			p.tenants[t.tenant] = cells
		}
		l.mergeCells(cells, t.cells, u.cur)
	}
	l.mergeCells(p.rest, u.rest, u.cur)
	return nil
}

// checkCells refuses ages beyond the ring.
func (l *Ledger) checkCells(cs []wireCell) error {
	for _, c := range cs {
		if int(c.age) >= l.ring {
			return fmt.Errorf("%w: cell age %d beyond the ring of %d", errGossip, c.age, l.ring)
		}
	}
	return nil
}

// mergeCells takes the larger of each counter of the same bucket, and a
// newer bucket over an older one.
func (l *Ledger) mergeCells(dst []cell, src []wireCell, cur int64) {
	for _, w := range src {
		b := cur - int64(w.age)
		if b <= 0 {
			continue
		}
		d := &dst[b%int64(l.ring)]
		switch {
		case d.b > b:
			continue
		case d.b < b:
			*d = cell{b: b}
		}
		d.in.add, d.in.sub = max(d.in.add, w.inAdd), max(d.in.sub, w.inSub)
		d.out.add, d.out.sub = max(d.out.add, w.outAdd), max(d.out.sub, w.outSub)
	}
}

// dropStalest forgets the peer heard longest ago.
func (l *Ledger) dropStalest() {
	var id peerID
	var at time.Time
	first := true
	for k, p := range l.peers {
		if first || p.heard.Before(at) {
			id, at, first = k, p.heard, false
		}
	}
	delete(l.peers, id)
}
