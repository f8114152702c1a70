package summary

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/bits-and-blooms/bloom/v3"
)

// Params size a Summary.
type Params struct {
	// CapacityBlocks is how many blocks the replica's engine can cache.
	CapacityBlocks int
	// FalsePositiveRate is the target rate of the whole summary when both
	// generations are full, 0 < rate < 1.
	FalsePositiveRate float64
}

// DefaultFalsePositiveRate is the summary's default target: a false
// positive sends one request to a replica that lacks one block it was
// promised, which costs at most that block's prefill.
const DefaultFalsePositiveRate = 0.01

// Limits on parameters, checked before any allocation so that decoding
// hostile bytes cannot allocate without bound.
const (
	// MaxCapacityBlocks bounds one replica's summary (64M blocks of 1 KiB
	// text is far beyond any engine's KV cache).
	MaxCapacityBlocks = 1 << 26
	minCapacityBlocks = 2
	blockBits         = 512
	maxK              = 7 // 7 positions of 9 bits fit one 64-bit mix
)

// Validate reports whether p can size a summary.
func (p Params) Validate() error {
	if p.CapacityBlocks < minCapacityBlocks || p.CapacityBlocks > MaxCapacityBlocks {
		return fmt.Errorf("summary: capacity %d blocks out of range [%d, %d]", p.CapacityBlocks, minCapacityBlocks, MaxCapacityBlocks)
	}
	if !(p.FalsePositiveRate >= 1e-6 && p.FalsePositiveRate <= 0.5) {
		return fmt.Errorf("summary: false-positive rate %v out of range [1e-6, 0.5]", p.FalsePositiveRate)
	}
	return nil
}

// geometry is the derived shape of one generation.
type geometry struct {
	perGen int  // inserts per generation before rotation
	m      uint // bits per generation, a multiple of blockBits
	k      uint // bits set per key
}

// geometry sizes the generations. Each takes 3/4 of the capacity before
// it rotates, so the summary remembers the last 0.75 to 1.5 capacities of
// distinct blocks: an LRU of C blocks holds exactly the last C. Erring
// long is cheaper than erring short: a block the summary remembers but the
// engine evicted sends a request to a replica that misses it (as any
// other would) and re-caches it there; a block the engine holds but the
// summary forgot sends it elsewhere, to recompute and duplicate it.
// Measured on the Mooncake trace: remembering C/2 to C (two generations
// of C/2) lost 3.5% of the hit ratio; 0.75C to 1.5C is within 0.2% of the
// exact view.
func (p Params) geometry() geometry {
	perGen := (3*p.CapacityBlocks + 3) / 4
	// Two generations are tested; each gets half of the error budget.
	perGenRate := 1 - math.Sqrt(1-p.FalsePositiveRate)
	bits, k := bitsPerKey(perGenRate)
	nblocks := uint(math.Ceil(float64(perGen) * bits / blockBits))
	if nblocks == 0 {
		nblocks = 1
	}
	return geometry{perGen: perGen, m: nblocks * blockBits, k: k}
}

// bitsPerKey returns the bits per key and the number of bits set per key
// that give a blocked Bloom filter the target false-positive rate. The rate
// of a blocked filter is the classic rate averaged over the Poisson number
// of keys that land in one block (Putze, Sanders, Singler 2007).
func bitsPerKey(target float64) (float64, uint) {
	for c := 1.44 * math.Log2(1/target); c < 64; c += 0.05 {
		kk := uint(math.Round(c * math.Ln2))
		for k := max(1, min(kk-1, maxK)); k <= min(maxK, kk+1); k++ {
			if blockedRate(c, k) <= target {
				return c, k
			}
		}
	}
	return 64, maxK
}

func blockedRate(bitsPerKey float64, k uint) float64 {
	lambda := blockBits / bitsPerKey
	p := math.Exp(-lambda)
	sum := 0.0
	limit := int(lambda + 12*math.Sqrt(lambda) + 12)
	for j := 0; j <= limit; j++ {
		sum += p * math.Pow(1-math.Pow(1-1.0/blockBits, float64(int(k)*j)), float64(k))
		p *= lambda / float64(j+1)
	}
	return sum
}

// Probe is a block hash prepared for testing against any number of
// summaries: hash a request once, then test it against every replica.
type Probe struct {
	block uint64 // picks the 512-bit block (scaled by each filter's size)
	bits  uint64 // 9 bits per position
}

// MakeProbes appends the probes of hashes to dst.
func MakeProbes(dst []Probe, hashes []uint64) []Probe {
	for _, h := range hashes {
		dst = append(dst, probeOf(h))
	}
	return dst
}

func probeOf(h uint64) Probe {
	x := mix(h)
	return Probe{block: x >> 32, bits: mix(x ^ 0x9e3779b97f4a7c15)}
}

// mix is the splitmix64 finalizer: keys from the simulator are small
// integers, and a full avalanche makes them as good as real hashes.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (g geometry) word(p Probe) uint64 {
	nblocks := uint64(g.m / blockBits)
	return (p.block * nblocks >> 32) * (blockBits / 64)
}

func test(words []uint64, g geometry, p Probe) bool {
	base := g.word(p)
	bits := p.bits
	for i := uint(0); i < g.k; i++ {
		pos := bits & (blockBits - 1)
		if words[base+pos>>6]&(1<<(pos&63)) == 0 {
			return false
		}
		bits >>= 9
	}
	return true
}

func set(words []uint64, g geometry, p Probe) {
	base := g.word(p)
	bits := p.bits
	for i := uint(0); i < g.k; i++ {
		pos := bits & (blockBits - 1)
		words[base+pos>>6] |= 1 << (pos & 63)
		bits >>= 9
	}
}

// Summary is an aging Bloom filter of the block hashes one replica holds.
// It is safe for concurrent readers and writers; it is meant to have one
// writer, the replica's owner, and copies elsewhere fed by Apply.
type Summary struct {
	params Params
	geo    geometry

	mu       sync.RWMutex
	gens     [2]*bloom.BloomFilter
	words    [2][]uint64 // the generations' bit words, gens[i].BitSet().Words()
	cur      int         // index of the newer generation
	curCount int         // inserts applied to gens[cur] since it was cleared
	epoch    uint64      // names this history; a restarted owner starts a new one
	version  uint64      // inserts applied since the epoch began
	log      []uint64    // the most recent applied inserts, for deltas
	logStart uint64      // version before log[0]
	logLimit int
}

// New returns an empty summary. epoch names its history: copies of it carry
// the same epoch, and an owner that loses its state must pick a new one
// (for example from the clock) so copies resynchronise instead of merging.
func New(p Params, epoch uint64) (*Summary, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	g := p.geometry()
	s := &Summary{params: p, geo: g, epoch: epoch}
	for i := range s.gens {
		s.gens[i] = bloom.New(g.m, g.k)
		s.words[i] = s.gens[i].BitSet().Words()
	}
	// Keep enough history to repair a copy that missed a few gossip rounds;
	// anything older is repaired with a full copy.
	s.logLimit = min(max(g.perGen/4, 1024), 1<<16)
	return s, nil
}

// Params returns the parameters the summary was sized with.
func (s *Summary) Params() Params { return s.params }

// Epoch returns the summary's history name.
func (s *Summary) Epoch() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.epoch
}

// Version returns the number of inserts applied in this epoch.
func (s *Summary) Version() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.version
}

// Add records that the replica now holds the blocks with these hashes.
// Blocks already in the newer generation cost nothing; blocks only in the
// older one are refreshed into the newer one. It returns how many inserts
// it applied.
func (s *Summary) Add(hashes []uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range hashes {
		if s.insert(probeOf(h)) {
			s.record(h)
			n++
		}
	}
	return n
}

// insert applies one key; it reports false when the key was already in the
// newer generation (a no-op that copies skip the same way).
func (s *Summary) insert(p Probe) bool {
	if test(s.words[s.cur], s.geo, p) {
		return false
	}
	set(s.words[s.cur], s.geo, p)
	s.version++
	s.curCount++
	if s.curCount >= s.geo.perGen {
		old := 1 - s.cur
		s.gens[old].ClearAll()
		s.cur = old
		s.curCount = 0
	}
	return true
}

func (s *Summary) record(h uint64) {
	if len(s.log) >= 2*s.logLimit {
		drop := len(s.log) - s.logLimit
		s.logStart += uint64(drop)
		s.log = append(s.log[:0], s.log[drop:]...)
	}
	s.log = append(s.log, h)
}

// Has reports whether the summary (probably) holds the block.
func (s *Summary) Has(h uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.has(probeOf(h))
}

func (s *Summary) has(p Probe) bool {
	return test(s.words[s.cur], s.geo, p) || test(s.words[1-s.cur], s.geo, p)
}

// Match returns the number of leading probes the summary holds: the
// request's prefix match on this replica. Because block hashes are chained,
// holding block i implies holding blocks before it, so the match is found
// by galloping then bisecting, in O(log n) tests.
func (s *Summary) Match(probes []Probe) int {
	if len(probes) == 0 {
		return 0
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.has(probes[0]) {
		return 0
	}
	lo, step := 0, 1 // probes[lo] is held
	hi := len(probes)
	for {
		next := lo + step
		if next >= len(probes) {
			break
		}
		if !s.has(probes[next]) {
			hi = next
			break
		}
		lo = next
		step *= 2
	}
	// Invariant: probes[lo] held, probes[hi] not (or hi == len).
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if s.has(probes[mid]) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo + 1
}

// ErrGap is returned by Apply when a delta does not start at the copy's
// version or epoch: the copy needs a full summary.
var ErrGap = errors.New("summary: delta does not follow this copy")

// ErrDiverged is returned by Apply when a replayed insert was a no-op on
// the copy, which proves the copy's bits differ from the owner's.
var ErrDiverged = errors.New("summary: copy diverged from its owner")

// Since returns the inserts applied after version v, in order, if the
// summary still remembers them; ok is false when v is too old (send a full
// copy) or in the future.
func (s *Summary) Since(v uint64) (hashes []uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if v < s.logStart || v > s.version {
		return nil, false
	}
	return append([]uint64(nil), s.log[v-s.logStart:]...), true
}

// Apply replays an owner's delta on a copy: the inserts that took the
// owner's summary of this epoch from version from to from+len(hashes).
// Deltas the copy already has are ignored; a delta beyond the copy's
// version returns ErrGap.
func (s *Summary) Apply(epoch, from uint64, hashes []uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if epoch != s.epoch || from > s.version {
		return ErrGap
	}
	skip := s.version - from
	if skip >= uint64(len(hashes)) {
		return nil // old news
	}
	for _, h := range hashes[skip:] {
		if !s.insert(probeOf(h)) {
			return ErrDiverged
		}
		s.record(h)
	}
	return nil
}

// Stats describes a summary for debugging and metrics.
type Stats struct {
	// MaxBlocks is the most blocks the summary remembers at its target
	// false-positive rate (both generations full).
	MaxBlocks      int    `json:"max_blocks"`
	Epoch          uint64 `json:"epoch"`
	Version        uint64 `json:"version"`
	CapacityBlocks int    `json:"capacity_blocks"`
	NewerInserts   int    `json:"newer_generation_inserts"`
	Bytes          int    `json:"bytes"`
}

// Stats returns the summary's size and position.
func (s *Summary) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return Stats{
		MaxBlocks: 2 * s.geo.perGen,
		Epoch:     s.epoch, Version: s.version, CapacityBlocks: s.params.CapacityBlocks,
		NewerInserts: s.curCount, Bytes: encodedSize(s.geo),
	}
}
