package summary

import (
	"bytes"
	"fmt"
	"testing"
)

func BenchmarkHashing(b *testing.B) {
	c := DefaultContract()
	for _, size := range []int{8 << 10, 32 << 10, 512 << 10} {
		text := bytes.Repeat([]byte("lorem ipsum "), size/12+1)[:size]
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			dst := make([]uint64, 0, size/c.BlockBytes)
			for b.Loop() {
				dst = c.AppendHashes(dst[:0], 1, text)
			}
		})
	}
}

func benchSummary(b *testing.B, capBlocks int) *Summary {
	s, err := New(Params{CapacityBlocks: capBlocks, FalsePositiveRate: 0.01}, 1)
	if err != nil {
		b.Fatal(err)
	}
	s.Add(chain(capBlocks*3/4, 99))
	return s
}

func BenchmarkSummary(b *testing.B) {
	const capBlocks = 100_000
	s := benchSummary(b, capBlocks)
	keys := chain(1<<16, 5)
	b.Run("Add", func(b *testing.B) {
		s := benchSummary(b, capBlocks)
		i := 0
		for b.Loop() {
			s.Add(keys[i&(len(keys)-1) : i&(len(keys)-1)+1])
			i++
		}
	})
	b.Run("Has/miss", func(b *testing.B) {
		i := 0
		for b.Loop() {
			s.Has(keys[i&(len(keys)-1)])
			i++
		}
	})
	held := chain(64, 99)
	b.Run("Has/hit", func(b *testing.B) {
		i := 0
		for b.Loop() {
			s.Has(held[i&63])
			i++
		}
	})
	for _, n := range []int{8, 32, 512} {
		q := MakeProbes(nil, append(chain(n/2, 99)[:n/2:n/2], chain(n-n/2, 7)...))
		b.Run(fmt.Sprintf("Match/%dblocks", n), func(b *testing.B) {
			for b.Loop() {
				s.Match(q)
			}
		})
	}
	c := DefaultContract().Fingerprint()
	enc := s.AppendEncode(nil, c)
	b.Run("Encode", func(b *testing.B) {
		b.SetBytes(int64(len(enc)))
		buf := make([]byte, 0, len(enc))
		for b.Loop() {
			buf = s.AppendEncode(buf[:0], c)
		}
		b.ReportMetric(float64(len(enc))/float64(s.Stats().MaxBlocks), "bytes/block")
	})
	b.Run("Decode", func(b *testing.B) {
		b.SetBytes(int64(len(enc)))
		for b.Loop() {
			if _, err := Decode(enc, c); err != nil {
				b.Fatal(err)
			}
		}
	})
}
