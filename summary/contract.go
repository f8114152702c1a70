package summary

import (
	"fmt"

	"github.com/zeebo/xxh3"
)

// Contract pins everything two routers must agree on for their block hashes
// to mean the same thing: block size, the canonical rendering, the hash
// function and its seed. Routers with different contract IDs refuse each
// other.
type Contract struct {
	// BlockBytes is the number of canonical-text bytes per block.
	BlockBytes int
	// Seed seeds the chain of every model.
	Seed uint64
}

// DefaultContract is the contract routers use unless configured otherwise.
//
// 1024-byte blocks are about 256 tokens of English text. Engines cache at
// 16-token granularity, so a router block only loses the tail of a match:
// on average half a block, 128 tokens, which is about 1% of the Mooncake
// conversation trace's mean prompt of 12k tokens (the simulation, which
// works in 512-token blocks, loses 2% that way and still reaches the
// oracle). Smaller blocks would make every summary larger by the same
// factor (a 1M-token engine cache is ~4k blocks, 6 KB of summary at this
// size) and every decision slower, for reuse that is at most one block
// longer.
func DefaultContract() Contract {
	return Contract{BlockBytes: 1024, Seed: 0x6b766d6573680001}
}

// renderVersion names the canonical rendering (package proxy/prompt) in
// the contract ID: it changes whenever that rendering does, so routers
// that render differently refuse each other instead of sharing hashes that
// mean different prefixes. prompt's TestRenderingIsPinned fails until it is
// bumped.
const renderVersion = 1

// ID names the contract; routers exchange it in their node metadata.
func (c Contract) ID() string {
	return fmt.Sprintf("kvm1-r%d-xxh3-b%d-s%016x", renderVersion, c.BlockBytes, c.Seed)
}

// Fingerprint is a 64-bit digest of ID, carried in encoded summaries.
func (c Contract) Fingerprint() uint64 {
	return xxh3.HashString(c.ID())
}

// Validate reports whether the contract is usable.
func (c Contract) Validate() error {
	if c.BlockBytes < 16 || c.BlockBytes > 1<<20 {
		return fmt.Errorf("contract: block size %d bytes out of range [16, 1048576]", c.BlockBytes)
	}
	return nil
}

// Root is the hash that precedes block 0 of a prompt for model. The model
// name and an optional cache salt scope every chain, so two models never
// share blocks, as engines never share KV across models or salts.
func (c Contract) Root(model, cacheSalt string) uint64 {
	h := xxh3.HashStringSeed(model, c.Seed)
	if cacheSalt != "" {
		h = xxh3.HashStringSeed(cacheSalt, h^0x5a17)
	}
	return h
}

// AppendHashes appends the chained hashes of every full block of text to
// dst, starting from root. A trailing partial block is not hashed: engines
// only reuse full blocks, and the next turn will complete it.
func (c Contract) AppendHashes(dst []uint64, root uint64, text []byte) []uint64 {
	h := root
	for len(text) >= c.BlockBytes {
		h = xxh3.HashSeed(text[:c.BlockBytes], h)
		dst = append(dst, h)
		text = text[c.BlockBytes:]
	}
	return dst
}

// ShortKey is the key of a text shorter than one block, which has no
// block hash: the hash of the whole text under root, so that such prompts
// are told apart (route.Request.Whole); 0 for a text of a full block or
// more, which its block hashes key.
func (c Contract) ShortKey(root uint64, text []byte) uint64 {
	if len(text) >= c.BlockBytes {
		return 0
	}
	return xxh3.HashSeed(text, root^0x5701e)
}
