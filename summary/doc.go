// Package summary owns the hashing contract of kvmesh and the per-replica
// summaries that routers gossip: the Bloom summary of one replica's
// prefix-cache blocks, the Index that matches a request against many
// summaries at once, and the deltas and encoding that copy a summary to
// other routers.
//
// Package proxy/prompt renders a request body to a canonical prompt text;
// the Contract cuts that text into fixed-size blocks and hashes them into a
// chain (Contract.AppendHashes): block i's hash covers blocks 0..i, so equal
// hashes mean an equal prefix. Every router must use the same Contract,
// which is why its ID travels in node metadata and in every encoded
// summary.
//
// A Summary is an aging Bloom filter over one replica's block hashes. It
// models the engine's LRU prefix cache: two generations, the newer one
// taking inserts and the older one forgotten when the newer holds three
// quarters of the capacity. A block found only in the older generation is refreshed into
// the newer one when it is added again, which is what an LRU does on a hit.
//
// Design notes (why it is built this way):
//
//   - The filter bits live in bits-and-blooms/bloom/v3 filters, but the bit
//     locations are derived from the block hash itself instead of bloom's
//     murmur3 double hashing: block hashes are already uniform 64-bit values,
//     so hashing them again is wasted work. The locations are cache-line
//     blocked (all k bits of a key in one 512-bit block), so a test costs one
//     memory access per generation instead of k. A blocked filter needs a few
//     more bits than a classic one for the same false-positive rate; sizing
//     accounts for it exactly (see bitsPerKey). The positions derive from a
//     short pattern of the hash, so that a delta carries that pattern
//     rather than the 64-bit hash; at 1% for the whole summary it costs
//     1.65 bytes per block it remembers (TestFalsePositiveRateAtCapacity).
//   - Longest-prefix match uses the chain: if block i is held, so are blocks
//     0..i-1, so the match is found by galloping and binary search in
//     O(log n) tests rather than one test per block.
//   - Copies of a summary stay bit-identical to the owner's: an insert is
//     applied only when it changes the filter, the owner logs exactly those
//     inserts (and its forgets and rotations), and a copy that replays them
//     in order reaches the same bits and the same rotation points. A version
//     counts log entries; a copy that sees a gap asks for a full copy
//     instead of guessing.
package summary
