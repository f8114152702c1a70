package summary

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/bits-and-blooms/bloom/v3"
)

// Encoding of a summary, version 2, all integers big-endian:
//
//	"KVMS" | format u8 | k u8 | newer u8 | pattern bits u8
//	contract fingerprint u64 | capacity blocks u32 | false-positive rate f64
//	epoch u64 | version u64 | newer-generation adds u32
//	rotations u64 | forgotten u32 | forgotten × (key u64 | age u8)
//	generation 0 | generation 1   (each in bloom/v3's binary encoding)
//
// The header fixes the geometry, so a decoder knows the exact length before
// it reads a bit, and bloom's own decoder only ever sees bytes whose
// lengths were checked (it trusts its input and would allocate whatever a
// hostile length field asks for). Forgotten keys are sorted, so equal
// summaries encode to equal bytes (the mesh compares digests of them).
// Version 1 (bit positions from the whole hash, no negative record) is not
// read: its bits mean something else.
const (
	magic       = "KVMS"
	formatV2    = 2
	headerSize  = 60
	negSize     = 9
	bloomHeader = 24
)

func encodedSize(g geometry, forgotten int) int {
	return headerSize + forgotten*negSize + 2*(bloomHeader+int(g.m/64)*8)
}

// AppendEncode appends the binary encoding of the summary to dst, stamped
// with the contract fingerprint of the router that hashed its blocks.
func (s *Summary) AppendEncode(dst []byte, contract uint64) []byte {
	s.mu.RLock()
	defer s.mu.RUnlock()
	dst = slices.Grow(dst, encodedSize(s.geo, len(s.neg)))
	dst = s.appendHeader(dst, contract)
	keys := make([]uint64, 0, len(s.neg))
	for k := range s.neg {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		dst = binary.BigEndian.AppendUint64(dst, k)
		dst = append(dst, byte(s.rot-s.neg[k]))
	}
	// Each generation in bloom/v3's binary encoding (m, k, the bitset's
	// length, its words; all big-endian), written directly: bloom's own
	// writer goes through encoding/binary a word at a time.
	for i := range s.gens {
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.geo.m))
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.geo.k))
		dst = binary.BigEndian.AppendUint64(dst, uint64(s.geo.m))
		dst = slices.Grow(dst, 8*len(s.words[i]))
		for _, w := range s.words[i] {
			dst = binary.BigEndian.AppendUint64(dst, w)
		}
	}
	return dst
}

// appendHeader appends the encoding's fixed header (through the count of
// forgotten keys). The caller holds s.mu.
func (s *Summary) appendHeader(dst []byte, contract uint64) []byte {
	dst = append(dst, magic...)
	dst = append(dst, formatV2, byte(s.geo.k), byte(s.cur), byte(s.geo.pat))
	dst = binary.BigEndian.AppendUint64(dst, contract)
	dst = binary.BigEndian.AppendUint32(dst, uint32(s.params.CapacityBlocks))
	dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(s.params.FalsePositiveRate))
	dst = binary.BigEndian.AppendUint64(dst, s.epoch)
	dst = binary.BigEndian.AppendUint64(dst, s.version)
	dst = binary.BigEndian.AppendUint32(dst, uint32(s.curCount))
	dst = binary.BigEndian.AppendUint64(dst, s.rot)
	return binary.BigEndian.AppendUint32(dst, uint32(len(s.neg)))
}

// ErrMalformed marks bytes that are not a valid summary encoding.
var ErrMalformed = errors.New("summary: malformed encoding")

// Decode parses an encoded summary. It checks every length and parameter
// before it allocates, and refuses summaries hashed under another contract.
func Decode(data []byte, contract uint64) (*Summary, error) {
	if len(data) < headerSize {
		return nil, fmt.Errorf("%w: %d bytes is shorter than the header", ErrMalformed, len(data))
	}
	if string(data[:4]) != magic {
		return nil, fmt.Errorf("%w: bad magic", ErrMalformed)
	}
	if data[4] != formatV2 {
		return nil, fmt.Errorf("%w: unknown format version %d", ErrMalformed, data[4])
	}
	k, cur, pat := uint(data[5]), int(data[6]), uint(data[7])
	if got := binary.BigEndian.Uint64(data[8:]); got != contract {
		return nil, fmt.Errorf("summary: hashed under contract %016x, this router uses %016x", got, contract)
	}
	p := Params{
		CapacityBlocks:    int(binary.BigEndian.Uint32(data[16:])),
		FalsePositiveRate: math.Float64frombits(binary.BigEndian.Uint64(data[20:])),
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	epoch := binary.BigEndian.Uint64(data[28:])
	version := binary.BigEndian.Uint64(data[36:])
	curCount := int(binary.BigEndian.Uint32(data[44:]))
	rot := binary.BigEndian.Uint64(data[48:])
	nneg := int64(binary.BigEndian.Uint32(data[56:]))
	g := p.geometry()
	if k != g.k || pat != g.pat || cur > 1 || curCount >= g.perGen || nneg > int64(maxNegOf(g)) {
		return nil, fmt.Errorf("%w: header inconsistent with its parameters", ErrMalformed)
	}
	if int64(len(data)) != int64(encodedSize(g, int(nneg))) {
		return nil, fmt.Errorf("%w: %d bytes, want %d for capacity %d", ErrMalformed, len(data), encodedSize(g, int(nneg)), p.CapacityBlocks)
	}
	s := &Summary{params: p, geo: g, epoch: epoch, version: version, cur: cur, curCount: curCount, rot: rot, logStart: version}
	s.logLimit = logLimitOf(g)
	off := headerSize
	if nneg > 0 {
		s.neg = make(map[uint64]uint64, nneg)
		prev := uint64(0)
		for i := range int(nneg) {
			key, age := binary.BigEndian.Uint64(data[off:]), uint64(data[off+8])
			if key >= g.universe() || age > 1 || age > rot || (i > 0 && key <= prev) {
				return nil, fmt.Errorf("%w: forgotten key %d of %d (age %d) out of order or range", ErrMalformed, i, nneg, age)
			}
			s.neg[key], prev = rot-age, key
			off += negSize
		}
		s.negN.Store(int32(len(s.neg)))
	}
	genLen := bloomHeader + int(g.m/64)*8
	for i := range s.gens {
		b := data[off+i*genLen : off+(i+1)*genLen]
		m := binary.BigEndian.Uint64(b[0:])
		kk := binary.BigEndian.Uint64(b[8:])
		bits := binary.BigEndian.Uint64(b[16:])
		if m != uint64(g.m) || kk != uint64(g.k) || bits != uint64(g.m) {
			return nil, fmt.Errorf("%w: generation %d header (m=%d k=%d len=%d) does not match m=%d k=%d", ErrMalformed, i, m, kk, bits, g.m, g.k)
		}
		// The lengths are checked: fill a filter of that geometry directly
		// (bloom's own decoder reads a word at a time through
		// encoding/binary).
		f := bloom.New(g.m, g.k)
		words := f.BitSet().Words()
		if uint(len(words))*64 != g.m || len(b) != bloomHeader+8*len(words) {
			return nil, fmt.Errorf("%w: generation %d has %d words", ErrMalformed, i, len(words))
		}
		for w := range words {
			words[w] = binary.BigEndian.Uint64(b[bloomHeader+8*w:])
		}
		s.gens[i], s.words[i] = f, words
	}
	s.oldCount = estimateAdds(s.words[1-cur], g)
	s.storeHeld()
	return s, nil
}
