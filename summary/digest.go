package summary

import (
	"slices"

	"github.com/zeebo/xxh3"
)

// Digest returns a 64-bit digest of everything the encoding holds (the
// geometry, epoch, version, counts, the negative record and the bits)
// and the version it is of. Equal summaries have equal digests; it costs
// a pass over the words, without encoding them (the mesh compares a copy
// with its owner by it).
func (s *Summary) Digest(contract uint64) (digest, version uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	h := xxh3.Hash(s.appendHeader(nil, contract))
	if len(s.neg) > 0 {
		keys := make([]uint64, 0, len(s.neg))
		for k := range s.neg {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			h = mix(h ^ k ^ (s.rot-s.neg[k])<<56)
		}
	}
	for g := range s.words {
		h = mix(h ^ uint64(g+1))
		for i, w := range s.words[g] {
			// Two multiplies per word: a few microseconds per summary.
			h = (h^w)*0x9e3779b97f4a7c15 + uint64(i)
			h ^= h >> 29
		}
	}
	return mix(h) | 1, s.version // never 0, which means "unknown"
}
