package summary

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func chain(n int, seed uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = mix(seed*1_000_003 + uint64(i) + 1)
	}
	return out
}

func TestMatchIsLongestHeldPrefix(t *testing.T) {
	s, err := New(Params{CapacityBlocks: 4096, FalsePositiveRate: 0.01}, 1)
	if err != nil {
		t.Fatal(err)
	}
	held := chain(40, 7)
	s.Add(held[:23])
	tests := []struct {
		name  string
		query []uint64
		want  int
	}{
		{"empty", nil, 0},
		{"exact", held[:23], 23},
		{"longer", held, 23},
		{"shorter", held[:5], 5},
		{"one", held[:1], 1},
		{"other chain", chain(30, 8), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.Match(MakeProbes(nil, tc.query)); got != tc.want {
				t.Fatalf("Match = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestAgingForgetsOldAndRefreshesReused(t *testing.T) {
	const capBlocks = 1000
	s, _ := New(Params{CapacityBlocks: capBlocks, FalsePositiveRate: 0.01}, 1)
	hot := chain(10, 1)
	old := chain(10, 2)
	s.Add(old)
	s.Add(hot)
	// Insert 3 capacities of other blocks, re-using hot as an LRU hit would.
	for i := 0; i < 3*capBlocks/10; i++ {
		s.Add(chain(10, uint64(100+i)))
		s.Add(hot)
	}
	if got := s.Match(MakeProbes(nil, hot)); got != 10 {
		t.Errorf("re-used prefix: match %d, want 10", got)
	}
	if got := s.Match(MakeProbes(nil, old)); got != 0 {
		t.Errorf("prefix older than the capacity: match %d, want 0", got)
	}
	recent := chain(10, uint64(100+3*capBlocks/10-1))
	if got := s.Match(MakeProbes(nil, recent)); got != 10 {
		t.Errorf("most recent prefix: match %d, want 10", got)
	}
}

func TestFalsePositiveRateAtCapacity(t *testing.T) {
	for _, fpr := range []float64{0.01, 0.001} {
		t.Run(fmt.Sprint(fpr), func(t *testing.T) {
			const capBlocks = 20000
			s, _ := New(Params{CapacityBlocks: capBlocks, FalsePositiveRate: fpr}, 1)
			// Fill until both generations are nearly full.
			s.Add(chain(s.Stats().MaxBlocks-1, 1))
			fp, n := 0, 200000
			for i := 0; i < n; i++ {
				if s.Has(mix(uint64(i) + 1<<40)) {
					fp++
				}
			}
			rate := float64(fp) / float64(n)
			if rate > fpr*1.3 {
				t.Fatalf("false-positive rate %.4f, target %.4f", rate, fpr)
			}
			bpb := float64(s.Stats().Bytes) / float64(s.Stats().MaxBlocks)
			t.Logf("fpr %.4f (target %.4f), %.3f bytes per block remembered", rate, fpr, bpb)
		})
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	s, _ := New(Params{CapacityBlocks: 3000, FalsePositiveRate: 0.01}, 42)
	s.Add(chain(1700, 3)) // past one rotation
	c := DefaultContract().Fingerprint()
	enc := s.AppendEncode(nil, c)
	d, err := Decode(enc, c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.AppendEncode(nil, c), enc) {
		t.Fatal("re-encoding differs")
	}
	if d.Epoch() != 42 || d.Version() != s.Version() {
		t.Fatalf("epoch/version %d/%d, want 42/%d", d.Epoch(), d.Version(), s.Version())
	}
	if _, err := Decode(enc, c+1); err == nil {
		t.Fatal("decoded a summary of another contract")
	}
	for _, cut := range []int{0, 10, headerSize, len(enc) - 1} {
		if _, err := Decode(enc[:cut], c); !errors.Is(err, ErrMalformed) {
			t.Fatalf("truncated to %d: err %v, want ErrMalformed", cut, err)
		}
	}
}

// The direct encoder writes exactly bloom/v3's encoding of each generation.
func TestEncodingIsBloomsEncoding(t *testing.T) {
	s, _ := New(Params{CapacityBlocks: 3000, FalsePositiveRate: 0.01}, 42)
	s.Add(chain(1700, 3))
	enc := s.AppendEncode(nil, 7)
	off := headerSize
	for i, g := range s.gens {
		want, err := g.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if got := enc[off : off+len(want)]; !bytes.Equal(got, want) {
			t.Fatalf("generation %d differs from bloom's MarshalBinary", i)
		}
		off += len(want)
	}
	if off != len(enc) {
		t.Fatalf("%d trailing bytes", len(enc)-off)
	}
}

func TestCopiesStayIdenticalThroughDeltas(t *testing.T) {
	c := DefaultContract().Fingerprint()
	owner, _ := New(Params{CapacityBlocks: 2000, FalsePositiveRate: 0.01}, 9)
	owner.Add(chain(50, 1))
	cp, err := Decode(owner.AppendEncode(nil, c), c)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var held [][]uint64
	for round := 0; round < 300; round++ {
		from := owner.Version()
		for range 1 + rng.IntN(3) {
			h := chain(1+rng.IntN(30), uint64(rng.IntN(80)))
			owner.Add(h)
			held = append(held, h)
			if rng.IntN(4) == 0 { // the engine had less than predicted
				prev := held[rng.IntN(len(held))]
				owner.Forget(prev[len(prev)/2:])
			}
		}
		enc, to, ok := owner.AppendDelta(nil, from)
		if !ok || to != owner.Version() {
			t.Fatalf("round %d: owner lost its recent log (ok=%v to=%d)", round, ok, to)
		}
		d, err := DecodeDelta(enc)
		if err != nil {
			t.Fatalf("round %d: decode: %v", round, err)
		}
		if !bytes.Equal(d.AppendEncode(nil), enc) {
			t.Fatalf("round %d: re-encoding differs", round)
		}
		if err := cp.ApplyDelta(d); err != nil {
			t.Fatalf("round %d: apply: %v", round, err)
		}
		if round%3 == 0 { // duplicates are harmless
			if err := cp.ApplyDelta(d); err != nil {
				t.Fatalf("round %d: re-apply: %v", round, err)
			}
		}
		if !bytes.Equal(owner.AppendEncode(nil, c), cp.AppendEncode(nil, c)) {
			t.Fatalf("round %d: copy differs from owner after replaying deltas", round)
		}
		if d1, _ := owner.Digest(c); func() bool { d2, _ := cp.Digest(c); return d1 != d2 }() {
			t.Fatalf("round %d: equal summaries, different digests", round)
		}
	}
	if owner.Stats().Forgotten == 0 || owner.Stats().NewerInserts == 0 {
		t.Fatalf("the test never forgot or rotated: %+v", owner.Stats())
	}
	// Overlap: a copy taken mid-way through a run of adds catches up from a
	// delta that starts before it.
	from := owner.Version()
	owner.Add(chain(40, 500))
	mid, _ := Decode(owner.AppendEncode(nil, c), c)
	owner.Add(chain(40, 501))
	enc, _, _ := owner.AppendDelta(nil, from)
	d, _ := DecodeDelta(enc)
	if err := mid.ApplyDelta(d); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(owner.AppendEncode(nil, c), mid.AppendEncode(nil, c)) {
		t.Fatal("overlapping delta: copy differs from owner")
	}
	if d1, _ := owner.Digest(c); func() bool { d2, _ := cp.Digest(c); return d1 == d2 }() {
		t.Fatal("different summaries, equal digests")
	}
	future := &Delta{Epoch: owner.Epoch(), From: owner.Version() + 5, Count: 1}
	if err := cp.ApplyDelta(future); !errors.Is(err, ErrGap) {
		t.Fatalf("future delta: %v, want ErrGap", err)
	}
	if err := cp.ApplyDelta(&Delta{Epoch: owner.Epoch() + 1, Count: 1}); !errors.Is(err, ErrGap) {
		t.Fatalf("other epoch: %v, want ErrGap", err)
	}
}

func TestForgetStopsMatchUntilAddedAgain(t *testing.T) {
	s, _ := New(Params{CapacityBlocks: 4096, FalsePositiveRate: 0.01}, 1)
	h := chain(20, 3)
	s.Add(h)
	tests := []struct {
		name string
		op   func()
		want int
	}{
		{"held", func() {}, 20},
		{"forget the tail", func() { s.Forget(h[12:]) }, 12},
		{"forget an unheld block: no-op", func() { s.Forget(chain(3, 99)) }, 12},
		{"add the tail again", func() { s.Add(h[12:]) }, 20},
		{"forget from block 5", func() { s.Forget(h[5:]) }, 5},
	}
	for _, tc := range tests {
		tc.op()
		if got := s.Match(MakeProbes(nil, h)); got != tc.want {
			t.Fatalf("%s: Match = %d, want %d", tc.name, got, tc.want)
		}
	}
	// The record is bounded, and ages out with the generations it hid.
	s.Add(chain(s.Stats().MaxBlocks, 50))
	if n := s.Stats().Forgotten; n != 0 {
		t.Fatalf("%d forgotten keys left after two rotations", n)
	}
	full := chain(maxNegOf(s.geo)+100, 60)
	s.Add(full)
	if n := s.Forget(full); n != maxNegOf(s.geo) {
		t.Fatalf("forgot %d, want the bound %d", n, maxNegOf(s.geo))
	}
}

// A delta of a busy tick costs under 2 bytes per block with the default
// parameters (what issue 9 asks of the gossip).
func TestDeltaBytesPerBlock(t *testing.T) {
	for _, tc := range []struct {
		capacity, perTick int
		maxBytes          float64
	}{{16384, 400, 2.0}, {16384, 100, 2.3}, {4096, 400, 1.8}, {16384, 6, 4.0}} {
		s, _ := New(Params{CapacityBlocks: tc.capacity, FalsePositiveRate: DefaultFalsePositiveRate}, 1)
		s.Add(chain(tc.capacity/2, 1))
		from := s.Version()
		s.Add(chain(tc.perTick, 2))
		enc, _, _ := s.AppendDelta(nil, from)
		per := float64(len(enc)-8-6) / float64(tc.perTick)
		t.Logf("capacity %d, %d adds: %.2f bytes per block (pattern %d bits)", tc.capacity, tc.perTick, per, s.geo.pat)
		if per > tc.maxBytes {
			t.Errorf("capacity %d, %d adds: %.2f bytes per block, want <= %.1f", tc.capacity, tc.perTick, per, tc.maxBytes)
		}
	}
}

// Hostile counts are refused before anything is allocated from them.
func TestDecodeDeltaHostileCounts(t *testing.T) {
	hdr := func(count, nseg uint64) []byte {
		b := make([]byte, 8)
		b = binary.AppendUvarint(b, 0)
		b = binary.AppendUvarint(b, count)
		return binary.AppendUvarint(b, nseg)
	}
	seg := func(b []byte, n uint64, k byte, nbytes uint64) []byte {
		b = append(b, 0)
		b = binary.AppendUvarint(b, n)
		b = append(b, k)
		return binary.AppendUvarint(b, nbytes)
	}
	tests := []struct {
		name string
		b    []byte
	}{
		{"count over the limit", hdr(maxDeltaEntries+1, 1)},
		{"segment count wraps", seg(hdr(10, 2), math.MaxUint64-3, 0, 1)},
		{"segment over the count", seg(hdr(10, 1), 11, 0, 2)},
		{"keys over the bytes", append(seg(hdr(1000, 1), 1000, 40, 2), 0, 0)},
		{"rice parameter too large", append(seg(hdr(1, 1), 1, 60, 8), make([]byte, 8)...)},
	}
	for _, tc := range tests {
		if _, err := DecodeDelta(tc.b); !errors.Is(err, ErrBadDelta) {
			t.Errorf("%s: err %v, want ErrBadDelta", tc.name, err)
		}
	}
}
