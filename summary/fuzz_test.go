package summary

import (
	"testing"
)

func FuzzDecode(f *testing.F) {
	c := DefaultContract().Fingerprint()
	s, _ := New(Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, 1)
	s.Add(chain(40, 1))
	f.Add(s.AppendEncode(nil, c))
	f.Add([]byte("KVMS\x01\x07\x00\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Decode(data, c)
		if err != nil {
			return
		}
		// Anything accepted must be usable and re-encode to itself.
		d.Match(MakeProbes(nil, chain(10, 1)))
		d.Add(chain(3, 2))
		if got := d.AppendEncode(nil, c); len(got) != len(data) {
			t.Fatalf("re-encoded %d bytes from %d", len(got), len(data))
		}
	})
}

func FuzzDecodeDelta(f *testing.F) {
	s, _ := New(Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, 1)
	s.Add(chain(40, 1))
	s.Forget(chain(5, 1))
	enc, _, _ := s.AppendDelta(nil, 0)
	f.Add(enc)
	v := s.Version()
	s.Cut(CutBoth) // generation cuts are consecutive rotations
	s.Add(chain(3, 2))
	enc, _, _ = s.AppendDelta(nil, v)
	f.Add(enc)
	f.Add([]byte{})
	f.Add(make([]byte, 12))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := DecodeDelta(data)
		if err != nil {
			return
		}
		// Anything accepted re-encodes to a delta that decodes the same,
		// and applies (or is refused) without harm.
		again, err := DecodeDelta(d.AppendEncode(nil))
		if err != nil || again.Count != d.Count || again.From != d.From || len(again.segs) != len(d.segs) {
			t.Fatalf("re-encoded delta: %v", err)
		}
		cp, _ := New(Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, d.Epoch)
		if cp.ApplyDelta(d) == nil {
			cp.Match(MakeProbes(nil, chain(10, 1)))
			if _, err := Decode(cp.AppendEncode(nil, 1), 1); err != nil {
				t.Fatalf("applied delta left an unencodable summary: %v", err)
			}
		}
	})
}
