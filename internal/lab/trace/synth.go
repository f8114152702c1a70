package trace

import "unsafe"

// DefaultBytesPerToken is the text length per token Synthesize uses when
// given a non-positive bytesPerToken; the replica simulator counts one token
// per 4 bytes.
const DefaultBytesPerToken = 4

// letters is weighted towards frequent English letters so the text looks
// word-like to a tokenizer; 32 entries let 5 random bits pick one.
const letters = "etaoinshrdlcumwfgypbvkjxqzetaoin"

// Synthesize returns deterministic prompt text for a request: block i of the
// text (MooncakeBlockTokens*bytesPerToken bytes of lowercase words and
// spaces, each full block ending in a space) depends only on hashIDs[i], and
// the whole text is cut to inputTokens*bytesPerToken bytes. Because the ids
// are chained prefix hashes, two prompts share a text prefix exactly where
// their traces share blocks. If the ids cover fewer than inputTokens tokens,
// the missing blocks are derived from the last id and their position, so the
// length is always inputTokens*bytesPerToken.
func Synthesize(hashIDs []int64, inputTokens int, bytesPerToken int) string {
	if bytesPerToken <= 0 {
		bytesPerToken = DefaultBytesPerToken
	}
	if inputTokens <= 0 {
		return ""
	}
	total := inputTokens * bytesPerToken
	block := MooncakeBlockTokens * bytesPerToken
	buf := make([]byte, total)
	var last uint64
	for i, off := 0, 0; off < total; i, off = i+1, off+block {
		var seed uint64
		if i < len(hashIDs) {
			seed = uint64(hashIDs[i])
			last = seed
		} else {
			// Beyond the listed ids: a stable function of the last id and the
			// position keeps equal traces equal and different ones apart.
			seed = splitmix64(last ^ 0x9e3779b97f4a7c15*uint64(i+1))
		}
		end := min(off+block, total)
		fillBlock(buf[off:end], seed, end-off == block)
	}
	// buf is never touched again, so handing its bytes to the string without
	// a second 512 KB copy is safe (strings.Builder does the same).
	return unsafe.String(&buf[0], len(buf))
}

// fillBlock writes the (prefix of the) text block for seed into dst. A
// partial block is a prefix of the full one, which keeps the prefix property
// when a prompt ends mid-block.
func fillBlock(dst []byte, seed uint64, full bool) {
	state := seed ^ 0x6a09e667f3bcc909 // so id 0 does not start from state 0
	i := 0
	for i < len(dst) {
		state += 0x9e3779b97f4a7c15
		r := mix(state)
		wl := 2 + int(r&7) // words of 2..9 letters
		r >>= 3
		for k := 0; k < wl && i < len(dst); k++ {
			dst[i] = letters[r&31]
			r >>= 5
			i++
		}
		if i < len(dst) {
			dst[i] = ' '
			i++
		}
	}
	if full && len(dst) > 0 {
		dst[len(dst)-1] = ' '
	}
}

// splitmix64 is one step of the SplitMix64 generator from state x.
func splitmix64(x uint64) uint64 { return mix(x + 0x9e3779b97f4a7c15) }

// mix is the SplitMix64 output finaliser.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
