package summary

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
)

// Deltas carry an owner's log entries to its copies. What a copy needs of
// an add is the key's place in the filter, (block, pattern): a number below
// the generation's universe nblocks << pat. A tick's adds form a set, and the
// filter's bits do not depend on the order of adds between two rotations,
// so a delta sends each run of adds (and of forgets) as a sorted set, coded
// as Rice-coded gaps: about log2(universe/n) + 1.5 bits per key for n keys,
// the entropy of the set plus a little. With the default parameters and a
// few hundred adds per replica per tick that is under 2 bytes per block,
// against 8 for a raw hash.
//
// Encoding, integers unsigned varints unless noted:
//
//	epoch u64 (big-endian) | from | count | segments | segment...
//	segment: op u8 (0 add, 1 forget, 2 rotate)
//	         add/forget: n | rice parameter u8 | byte length | Rice-coded gaps
//
// count is the number of log entries (a rotation is one), from the version
// the first one follows.

// Delta is a decoded delta: Count log entries of epoch Epoch that follow
// version From.
type Delta struct {
	Epoch, From, Count uint64
	segs               []segment
}

type segment struct {
	op   uint64
	keys []uint64 // sorted, distinct; nil for a rotation
}

// n is the number of log entries a segment stands for.
func (g segment) n() uint64 {
	if g.op == opRotate {
		return 1
	}
	return uint64(len(g.keys))
}

// Limits a decoder enforces before it allocates.
const (
	maxDeltaEntries = 1 << 22
	maxKey          = 1 << 48
	maxRice         = 48
)

// AppendDelta appends the delta of the log entries after version from to
// dst and returns the version it reaches. ok is false when from is older
// than the log remembers or in the future: send a full copy instead.
func (s *Summary) AppendDelta(dst []byte, from uint64) (out []byte, to uint64, ok bool) {
	s.mu.RLock()
	if from < s.logStart || from > s.version {
		s.mu.RUnlock()
		return dst, 0, false
	}
	entries := slices.Clone(s.log[from-s.logStart:])
	epoch, to := s.epoch, s.version
	s.mu.RUnlock()
	dst = binary.BigEndian.AppendUint64(dst, epoch)
	dst = binary.AppendUvarint(dst, from)
	dst = binary.AppendUvarint(dst, uint64(len(entries)))
	nseg := 0
	for i := range entries {
		if i == 0 || entries[i]&opMask != entries[i-1]&opMask || entries[i]&opMask == opRotate {
			nseg++
		}
	}
	dst = binary.AppendUvarint(dst, uint64(nseg))
	for i := 0; i < len(entries); {
		op := entries[i] & opMask
		j := i + 1
		for op != opRotate && j < len(entries) && entries[j]&opMask == op {
			j++
		}
		dst = append(dst, byte(op>>62))
		if op != opRotate {
			keys := entries[i:j]
			for x := range keys {
				keys[x] &^= opMask
			}
			slices.Sort(keys)
			dst = appendRice(dst, keys)
		}
		i = j
	}
	return dst, to, true
}

// appendRice appends n | k | byte length | the Rice-coded gaps of sorted,
// distinct keys.
func appendRice(dst []byte, keys []uint64) []byte {
	n := uint64(len(keys))
	dst = binary.AppendUvarint(dst, n)
	mean := (keys[len(keys)-1] + 1) / n
	k0 := 0
	if mean > 1 {
		k0 = bits.Len64(mean*7/10) - 1 // log2 of the mean gap × ln 2
	}
	best, bestBits := 0, uint64(1<<63)
	for k := max(k0-1, 0); k <= min(k0+1, maxRice); k++ {
		total, prev := uint64(0), uint64(0)
		for i, key := range keys {
			gap := key
			if i > 0 {
				gap = key - prev - 1
			}
			prev = key
			total += gap>>uint(k) + 1 + uint64(k)
		}
		if total < bestBits {
			best, bestBits = k, total
		}
	}
	dst = append(dst, byte(best))
	dst = binary.AppendUvarint(dst, (bestBits+7)/8)
	var w bitWriter
	w.b = dst
	prev := uint64(0)
	for i, key := range keys {
		gap := key
		if i > 0 {
			gap = key - prev - 1
		}
		prev = key
		for q := gap >> uint(best); q > 0; {
			c := min(q, 32)
			w.write(1<<c-1, uint(c))
			q -= c
		}
		w.write(0, 1)
		w.write(gap&(1<<uint(best)-1), uint(best))
	}
	return w.flush()
}

// bitWriter appends bits most significant first.
type bitWriter struct {
	b    []byte
	acc  uint64
	nacc uint
}

func (w *bitWriter) write(v uint64, n uint) {
	for n > 0 {
		c := min(n, 56-w.nacc)
		w.acc = w.acc<<c | (v>>(n-c))&(1<<c-1)
		w.nacc += c
		n -= c
		for w.nacc >= 8 {
			w.b = append(w.b, byte(w.acc>>(w.nacc-8)))
			w.nacc -= 8
		}
	}
}

func (w *bitWriter) flush() []byte {
	if w.nacc > 0 {
		w.b = append(w.b, byte(w.acc<<(8-w.nacc)))
		w.nacc = 0
	}
	return w.b
}

// bitReader reads bits most significant first from a bounded slice.
type bitReader struct {
	b   []byte
	pos uint64 // bit position
}

// peek returns the 64 bits from pos, zeros past the end.
func (r *bitReader) peek() uint64 {
	i, off := r.pos>>3, r.pos&7
	var w uint64
	if i+9 <= uint64(len(r.b)) {
		w = binary.BigEndian.Uint64(r.b[i:])
		if off > 0 {
			w = w<<off | uint64(r.b[i+8])>>(8-off)
		}
		return w
	}
	// Near the end: the same, a byte at a time, zeros past the end.
	for j := uint64(0); j < 9; j++ {
		var c byte
		if i+j < uint64(len(r.b)) {
			c = r.b[i+j]
		}
		if j < 8 {
			w = w<<8 | uint64(c)
		} else if off > 0 {
			w = w<<off | uint64(c)>>(8-off)
		}
	}
	return w
}

func (r *bitReader) left() uint64 { return uint64(len(r.b))*8 - r.pos }

// unary reads ones up to a zero; ok is false past the end or over limit.
func (r *bitReader) unary(limit uint64) (q uint64, ok bool) {
	for {
		if r.left() == 0 {
			return 0, false
		}
		w := r.peek()
		ones := uint64(bits.LeadingZeros64(^w))
		if ones < 64 {
			if ones+1 > r.left() {
				return 0, false
			}
			r.pos += ones + 1
			q += ones
			return q, q <= limit
		}
		if 64 > r.left() {
			return 0, false
		}
		r.pos += 64
		q += 64
		if q > limit {
			return 0, false
		}
	}
}

func (r *bitReader) read(n uint) (uint64, bool) {
	if n == 0 {
		return 0, true
	}
	if uint64(n) > r.left() {
		return 0, false
	}
	v := r.peek() >> (64 - n)
	r.pos += uint64(n)
	return v, true
}

// ErrBadDelta marks bytes that are not a valid delta.
var ErrBadDelta = errors.New("summary: malformed delta")

// DecodeDelta parses a delta. It needs no summary and takes no lock, so a
// router decodes before it locks anything; ApplyDelta checks the keys
// against the copy's geometry.
func DecodeDelta(b []byte) (*Delta, error) {
	bad := func(why string, args ...any) (*Delta, error) {
		return nil, fmt.Errorf("%w: %s", ErrBadDelta, fmt.Sprintf(why, args...))
	}
	if len(b) < 8 {
		return bad("%d bytes", len(b))
	}
	d := &Delta{Epoch: binary.BigEndian.Uint64(b)}
	b = b[8:]
	uv := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	var ok1, ok2, ok3 bool
	var nseg uint64
	d.From, ok1 = uv()
	d.Count, ok2 = uv()
	nseg, ok3 = uv()
	if !ok1 || !ok2 || !ok3 {
		return bad("truncated header")
	}
	if d.Count > maxDeltaEntries || nseg > d.Count || d.From > 1<<62 {
		return bad("%d entries in %d segments from %d", d.Count, nseg, d.From)
	}
	total := uint64(0)
	for i := uint64(0); i < nseg; i++ {
		if len(b) == 0 {
			return bad("truncated segment %d", i)
		}
		op := uint64(b[0]) << 62
		b = b[1:]
		switch op {
		case opRotate:
			d.segs = append(d.segs, segment{op: opRotate})
			total++
			continue
		case opAdd, opForget:
		default:
			return bad("segment %d: op %d", i, op>>62)
		}
		n, ok := uv()
		if !ok || len(b) == 0 {
			return bad("segment %d: truncated", i)
		}
		k := uint(b[0])
		b = b[1:]
		nbytes, ok := uv()
		// n is bounded by the count before any arithmetic on it (no wrap).
		if !ok || n == 0 || n > d.Count-total || k > maxRice || nbytes > uint64(len(b)) || n*(uint64(k)+1) > nbytes*8 {
			return bad("segment %d: %d keys, rice %d, %d bytes", i, n, k, nbytes)
		}
		r := bitReader{b: b[:nbytes]}
		keys := make([]uint64, 0, n)
		prev := uint64(0)
		for j := uint64(0); j < n; j++ {
			q, ok := r.unary(maxKey >> k)
			if !ok {
				return bad("segment %d: key %d truncated or out of range", i, j)
			}
			low, ok := r.read(k)
			if !ok {
				return bad("segment %d: truncated key %d", i, j)
			}
			key := q<<k | low
			if j > 0 {
				key += prev + 1
			}
			if key >= maxKey {
				return bad("segment %d: key %d out of range", i, j)
			}
			keys = append(keys, key)
			prev = key
		}
		if (r.pos+7)/8 != nbytes {
			return bad("segment %d: %d bytes for %d bits", i, nbytes, r.pos)
		}
		b = b[nbytes:]
		d.segs = append(d.segs, segment{op: op, keys: keys})
		total += n
	}
	if total != d.Count || len(b) != 0 {
		return bad("%d entries for a count of %d, %d trailing bytes", total, d.Count, len(b))
	}
	return d, nil
}

// AppendEncode re-encodes a decoded delta (its canonical form).
func (d *Delta) AppendEncode(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, d.Epoch)
	dst = binary.AppendUvarint(dst, d.From)
	dst = binary.AppendUvarint(dst, d.Count)
	dst = binary.AppendUvarint(dst, uint64(len(d.segs)))
	for _, g := range d.segs {
		dst = append(dst, byte(g.op>>62))
		if g.op != opRotate {
			dst = appendRice(dst, g.keys)
		}
	}
	return dst
}

// To is the version a copy reaches by applying the delta.
func (d *Delta) To() uint64 { return d.From + d.Count }

// ApplyDelta replays an owner's delta on a copy. A delta the copy already
// has is ignored; one that overlaps the copy's version is applied from that
// version on (re-setting bits is idempotent, and the counts start at the
// copy's version); one beyond it, or of another epoch, returns ErrGap. Keys
// outside the copy's geometry return ErrBadDelta, before anything changes.
func (s *Summary) ApplyDelta(d *Delta) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.Epoch != s.epoch || d.From > s.version {
		return ErrGap
	}
	if d.To() <= s.version {
		return nil
	}
	// Check first, so a bad delta changes nothing.
	u := s.geo.universe()
	pos, count := d.From, s.curCount
	for _, g := range d.segs {
		end := pos + g.n()
		if end > s.version {
			switch g.op {
			case opAdd:
				if g.keys[len(g.keys)-1] >= u {
					return fmt.Errorf("%w: key beyond this copy's geometry", ErrBadDelta)
				}
				count += int(end - max(pos, s.version))
				if count >= s.geo.perGen+1 {
					return fmt.Errorf("%w: generation overfilled", ErrBadDelta)
				}
			case opForget:
				if g.keys[len(g.keys)-1] >= u {
					return fmt.Errorf("%w: key beyond this copy's geometry", ErrBadDelta)
				}
			case opRotate:
				count = 0
			}
		}
		pos = end
	}
	if count >= s.geo.perGen {
		return fmt.Errorf("%w: generation left full", ErrBadDelta)
	}
	pos = d.From
	for _, g := range d.segs {
		end := pos + g.n()
		if end > s.version {
			switch g.op {
			case opAdd:
				for _, key := range g.keys {
					s.applyAdd(key)
				}
				s.curCount += int(end - max(pos, s.version))
			case opForget:
				for _, key := range g.keys {
					if len(s.neg) < maxNegOf(s.geo) {
						s.applyForget(key)
					}
				}
			case opRotate:
				s.rotate()
			}
			s.version = end
		}
		pos = end
	}
	// A copy keeps no log of its own: should it become the owner, its log
	// starts here.
	s.log, s.logStart = s.log[:0], s.version
	s.storeHeld()
	return nil
}
