package replicasim

import (
	"encoding/binary"
	"strings"

	"github.com/zeebo/xxh3"
)

// Chat template markers (ChatML-like). The rendering of a conversation is a
// prefix of the rendering of any later turn of it, which is what lets the
// prefix cache serve the next turn.
const (
	imStart = "<|im_start|>"
	imEnd   = "<|im_end|>\n"
	// genPrompt opens the assistant turn the engine is asked to generate.
	genPrompt = imStart + "assistant\n"
)

// renderChat renders chat messages with the ChatML-like template and,
// with gen, the generation prompt.
func renderChat(msgs []chatMessage, gen bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(imStart)
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString(imEnd)
	}
	if gen {
		b.WriteString(genPrompt)
	}
	return b.String()
}

// countTokens is the tokenization approximation: one token per 4 bytes, the
// last partial chunk counting as one.
func countTokens(text string) int {
	return (len(text) + bytesPerToken - 1) / bytesPerToken
}

// blockHashes returns the chained hashes of the full blocks of text. Block i
// covers bytes [i*bs*4, (i+1)*bs*4); its hash is xxh3 of those bytes seeded
// with the hash of block i-1 (root for the first: 0 for the base model, the
// adapter's for a LoRA adapter, loraRoot), so equal hashes mean an equal
// prefix up to and including that block, under the same adapter.
func blockHashes(text string, blockSize int, root uint64) []uint64 {
	blockBytes := blockSize * bytesPerToken
	n := len(text) / blockBytes
	out := make([]uint64, n)
	prev := root
	for i := range n {
		prev = xxh3.HashStringSeed(text[i*blockBytes:(i+1)*blockBytes], prev)
		out[i] = prev
	}
	return out
}

// loraRoot is the root of the block chains of a request of adapter (""
// for the base model: 0). vLLM puts the adapter's id in every block's
// hash, so an adapter's blocks are never another's or the base model's.
func loraRoot(adapter string) uint64 {
	if adapter == "" {
		return 0
	}
	return xxh3.HashStringSeed(adapter, 0x10a)
}

// fillerWords are three-letter words; each generated token is " "+word, so
// exactly bytesPerToken bytes.
var fillerWords = [...]string{
	"the", "and", "for", "you", "not", "are", "all", "new", "was", "can",
	"has", "but", "one", "our", "out", "day", "get", "use", "man", "way",
	"who", "its", "did", "may", "say", "see", "two", "how", "now", "old",
	"any", "big", "sun", "sky", "sea", "red", "box", "cat", "dog", "key",
	"map", "run", "set", "top", "cup", "pen", "air", "art", "end", "few",
}

// fillerToken returns the deterministic output token at position i for a
// prompt whose text hashes to seed.
func fillerToken(seed uint64, i int) string {
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(i))
	h := xxh3.HashSeed(buf[:], seed)
	return " " + fillerWords[h%uint64(len(fillerWords))]
}
