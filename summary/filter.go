package summary

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

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
	perGen  int    // inserts per generation before rotation
	m       uint   // bits per generation, a multiple of blockBits
	k       uint   // bits set per key
	nblocks uint64 // m / blockBits
	pat     uint   // pattern bits: a key's bit positions derive from these alone
}

// A key's place in a generation is its 512-bit block and a pattern of pat
// bits, from which its k bit positions are derived. A copy therefore needs
// only (block, pattern), log2(nblocks)+pat bits per key, to set the same
// bits as the owner: that is what deltas carry (see delta.go). Two keys with
// the same block and pattern are one key to the filter; the collision adds
// λ/2^pat to the rate of a generation holding λ keys per block, which
// geometry counts against the target.
//
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
	bits, k, pat := bitsPerKey(perGenRate)
	nblocks := uint(math.Ceil(float64(perGen) * bits / blockBits))
	if nblocks == 0 {
		nblocks = 1
	}
	return geometry{perGen: perGen, m: nblocks * blockBits, k: k, nblocks: uint64(nblocks), pat: pat}
}

// bitsPerKey returns the bits per key, the number of bits set per key and
// the pattern width that give a blocked Bloom filter the target
// false-positive rate. The rate of a blocked filter is the classic rate
// averaged over the Poisson number of keys that land in one block (Putze,
// Sanders, Singler 2007), plus the pattern collisions. The pattern is the
// narrowest that costs at most a third more bits per key than an
// unpatterned filter: every pattern bit is a bit per key in every delta,
// a bit per key of filter only a bit per key of memory.
func bitsPerKey(target float64) (float64, uint, uint) {
	plain, _ := bloomBits(target, 0, 0)
	limit := plain * 4 / 3
	// The collision term alone must fit under the target at the limit.
	pat := uint(max(8, math.Ceil(math.Log2(blockBits/limit/target))))
	for ; pat < maxPatternBits; pat++ {
		if c, k := bloomBits(target, pat, plain); c <= limit {
			return c, k, pat
		}
	}
	c, k := bloomBits(target, maxPatternBits, plain)
	return c, k, maxPatternBits
}

// bloomBits is the smallest bits per key, on a grid of 0.05 from the
// classic estimate (and at least from), and its k that meet target with
// pat pattern bits (0: positions from the whole hash).
func bloomBits(target float64, pat uint, from float64) (float64, uint) {
	ok := func(c float64) (uint, bool) {
		collide := 0.0
		if pat > 0 {
			collide = blockBits / c / float64(uint64(1)<<pat)
		}
		kk := uint(math.Round(c * math.Ln2))
		for k := max(1, min(kk-1, maxK)); k <= min(maxK, kk+1); k++ {
			if blockedRate(c, k)+collide <= target {
				return k, true
			}
		}
		return 0, false
	}
	start := max(1.44*math.Log2(1/target), from)
	// Feasibility grows with c: bisect the grid steps from start to 64.
	lo, hi := 0, int(math.Ceil((64-start)/0.05)) // hi is feasible or the end
	if k, yes := ok(start); yes {
		return start, k
	}
	if _, yes := ok(start + float64(hi)*0.05); !yes {
		return 64, maxK
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if _, yes := ok(start + float64(mid)*0.05); yes {
			hi = mid
		} else {
			lo = mid
		}
	}
	c := start + float64(hi)*0.05
	k, _ := ok(c)
	return c, k
}

func blockedRate(bitsPerKey float64, k uint) float64 {
	lambda := blockBits / bitsPerKey
	p := math.Exp(-lambda)
	sum := 0.0
	limit := int(lambda + 12*math.Sqrt(lambda) + 12)
	// (1-1/512)^(k·j) by repeated multiplication, (1-that)^k by k
	// multiplications: no Pow in the loop (a full copy's decoder sizes its
	// geometry with this).
	q, qj := math.Pow(1-1.0/blockBits, float64(k)), 1.0
	for j := 0; j <= limit; j++ {
		in, pw := 1-qj, 1.0
		for range k {
			pw *= in
		}
		sum += p * pw
		p *= lambda / float64(j+1)
		qj *= q
	}
	return sum
}

// maxPatternBits bounds the pattern; a key (block, pattern) stays under
// 2^48 for every capacity.
const maxPatternBits = 24

// Probe is a block hash prepared for testing against any number of
// summaries: hash a request once, then test it against every replica.
type Probe struct {
	x uint64 // the mixed hash: block selector in the high half, pattern in the low bits
}

// MakeProbes appends the probes of hashes to dst.
func MakeProbes(dst []Probe, hashes []uint64) []Probe {
	for _, h := range hashes {
		dst = append(dst, probeOf(h))
	}
	return dst
}

func probeOf(h uint64) Probe { return Probe{x: mix(h)} }

// mix is the splitmix64 finalizer: keys from the simulator are small
// integers, and a full avalanche makes them as good as real hashes.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// key is a probe's place in a generation: block << pat | pattern. Keys are
// what the owner logs, deltas carry and the negative record holds.
func (g geometry) key(p Probe) uint64 {
	return ((p.x>>32)*g.nblocks>>32)<<g.pat | p.x&(1<<g.pat-1)
}

// universe is one past the largest key.
func (g geometry) universe() uint64 { return g.nblocks << g.pat }

// locate returns the first word of a key's block and its bit positions
// (9 bits each).
func (g geometry) locate(key uint64) (base uint64, bits uint64) {
	return (key >> g.pat) * (blockBits / 64), mix(key&(1<<g.pat-1) ^ 0x9e3779b97f4a7c15)
}

func test(words []uint64, g geometry, base, bits uint64) bool {
	for i := uint(0); i < g.k; i++ {
		pos := bits & (blockBits - 1)
		if words[base+pos>>6]&(1<<(pos&63)) == 0 {
			return false
		}
		bits >>= 9
	}
	return true
}

// set sets a key's k bits in words and returns which of its positions
// were clear before (bit i for the i-th): an Index column mirrors words
// exactly, so only those need mirroring, and a bit already set (most of
// them in a filled generation) costs no write to the Index's rows, which
// are a cache miss each.
func set(words []uint64, g geometry, base, bits uint64) (fresh uint64) {
	for i := uint(0); i < g.k; i++ {
		pos := bits & (blockBits - 1)
		w, b := &words[base+pos>>6], uint64(1)<<(pos&63)
		if *w&b == 0 {
			*w |= b
			fresh |= 1 << i
		}
		bits >>= 9
	}
	return fresh
}

// Ops of the summary's log. A log entry is a key with the op in its top
// bits; the version counts entries.
const (
	opAdd    uint64 = 0
	opForget uint64 = 1 << 62
	opRotate uint64 = 2 << 62
	opMask   uint64 = 3 << 62
)

// Summary is an aging Bloom filter of the block hashes one replica holds,
// with a bounded negative record of blocks the replica was found not to
// hold. It is safe for concurrent readers and writers; it is meant to have
// one writer, the replica's owner, and copies elsewhere fed by ApplyDelta.
type Summary struct {
	// The fields a decision reads of every summary without its lock come
	// first, to share one cache line: epoch (views check it per
	// candidate), mirror and negN (Index.Match).
	epoch uint64 // names this history; a restarted owner starts a new one
	// mirror is this summary's column in an Index, nil when it has none
	// (index.go). It is written under mu with the write lock (every bit
	// write of words is mirrored there under the same lock) and read
	// without a lock by Index.Match.
	mirror atomic.Pointer[column]
	// negN is len(neg), for Index.Match to tell without the lock that
	// the negative record must be consulted.
	negN atomic.Int32

	params Params
	geo    geometry

	mu       sync.RWMutex
	gens     [2]*bloom.BloomFilter
	words    [2][]uint64       // the generations' bit words, gens[i].BitSet().Words()
	cur      int               // index of the newer generation
	curCount int               // adds applied to gens[cur] since it was cleared
	version  uint64            // log entries applied since the epoch began
	rot      uint64            // rotations since the epoch began (ages the negative record)
	neg      map[uint64]uint64 // forgotten key -> rot when forgotten
	log      []uint64          // the most recent log entries, for deltas
	logStart uint64            // version before log[0]
	logLimit int
	cut      cutState // the owner's correction state (cut.go)
	// oldCount is the older generation's adds, curCount when it rotated
	// (estimated from its bits in a decoded copy: the encoding does not
	// carry it).
	oldCount int
	// held is curCount + oldCount, stored by whatever changes either
	// (storeHeld), so that Held takes no lock: a decision reads it of
	// every candidate this router owns.
	held atomic.Int64
	// kept is the owner's hashes of each generation's adds, indexed as
	// gens, for Resized (resize.go); copies keep none.
	kept [2]keptHashes
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
	s.logLimit = logLimitOf(g)
	return s, nil
}

// logLimitOf is how many log entries a summary keeps: enough for a few
// gossip rounds of a busy replica; an owner that falls further behind its
// own log sends full copies.
func logLimitOf(g geometry) int { return min(max(g.perGen/4, 1024), 1<<16) }

// maxNegOf bounds the negative record: forgets beyond it are refused (the
// blocks then age out with their generation, as any block does).
func maxNegOf(g geometry) int { return min(max(g.perGen/4, 256), 1<<16) }

// Params returns the parameters the summary was sized with.
func (s *Summary) Params() Params { return s.params }

// Epoch returns the summary's history name. It never changes, so it
// takes no lock (views call it per candidate per request).
func (s *Summary) Epoch() uint64 { return s.epoch }

// Version returns the number of log entries (adds, forgets, rotations)
// applied in this epoch.
func (s *Summary) Version() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.version
}

// Add records that the replica now holds the blocks with these hashes.
// Blocks already in the newer generation cost nothing; blocks only in the
// older one are refreshed into the newer one; a forgotten block is
// remembered again. It returns how many adds it logged.
func (s *Summary) Add(hashes []uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range hashes {
		key := s.geo.key(probeOf(h))
		base, bits := s.geo.locate(key)
		_, forgotten := s.neg[key]
		if !forgotten && test(s.words[s.cur], s.geo, base, bits) {
			continue
		}
		s.cut.noteAdd(s.words[s.cur], s.words[1-s.cur], s.geo, key, base, bits, forgotten)
		s.applyAdd(key)
		s.kept[s.cur].add(h, keptLimit(s.geo))
		s.version++
		s.curCount++
		s.record(key | opAdd)
		n++
		if s.curCount >= s.cut.rotateAt(s.geo) {
			s.rotate()
			s.version++
			s.record(opRotate)
			s.cut.filled(s.geo)
		}
	}
	s.storeHeld()
	return n
}

// Forget records that the replica does not hold these blocks (its engine
// reported fewer cached tokens than the summary predicted): Has and Match
// stop at them until they are added again. Blocks the summary does not
// claim cost nothing; once the negative record is full, further forgets are
// refused. It returns how many forgets it logged.
func (s *Summary) Forget(hashes []uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, _ := s.forgetLocked(hashes)
	return n
}

// forgetLocked forgets the keys of hashes the summary claims and returns
// how many it logged and how many the full record refused.
func (s *Summary) forgetLocked(hashes []uint64) (n, refused int) {
	for _, h := range hashes {
		key := s.geo.key(probeOf(h))
		if !s.hasKey(key) {
			continue
		}
		if len(s.neg) >= maxNegOf(s.geo) {
			refused++
			continue
		}
		s.applyForget(key)
		s.version++
		s.record(key | opForget)
		n++
	}
	return n, refused
}

func (s *Summary) applyAdd(key uint64) {
	base, bits := s.geo.locate(key)
	fresh := set(s.words[s.cur], s.geo, base, bits)
	if c := s.mirror.Load(); c != nil && fresh != 0 {
		c.set(s.cur, base, bits, fresh)
	}
	if len(s.neg) > 0 {
		delete(s.neg, key)
		s.setNegN()
	}
}

// setNegN stores len(s.neg) in negN, and in the Index column s mirrors
// into, if any (IndexHint checks it there). The caller holds s.mu.
func (s *Summary) setNegN() {
	n := len(s.neg)
	s.negN.Store(int32(n))
	if c := s.mirror.Load(); c != nil {
		c.sh.setNeg(c.col, n != 0)
	}
}

func (s *Summary) applyForget(key uint64) {
	if s.neg == nil {
		s.neg = map[uint64]uint64{}
	}
	s.neg[key] = s.rot
	s.setNegN()
}

// rotate clears the older generation and makes it the newer one. Negative
// entries older than two rotations go: every add they could hide is gone.
func (s *Summary) rotate() {
	old := 1 - s.cur
	if c := s.mirror.Load(); c != nil {
		c.clear(s.words[old], old)
	}
	s.gens[old].ClearAll()
	s.kept[old].clear()
	s.cur = old
	s.oldCount, s.curCount = s.curCount, 0
	s.storeHeld()
	s.rot++
	for k, r := range s.neg {
		if s.rot-r >= 2 {
			delete(s.neg, k)
		}
	}
	s.setNegN()
}

func (s *Summary) record(e uint64) {
	if len(s.log) >= 2*s.logLimit {
		drop := len(s.log) - s.logLimit
		s.logStart += uint64(drop)
		s.log = append(s.log[:0], s.log[drop:]...)
	}
	s.log = append(s.log, e)
}

// Held is how many blocks the summary remembers: the adds in its two
// generations (a block refreshed into the newer one counts in both,
// and a generation of a decoded copy older than its last rotation is
// estimated from its bits). An owner and its copies agree on it up to
// that estimate, so every router reads a replica's fill alike: a new
// or emptied replica (a restart cuts both generations) holds few.
func (s *Summary) Held() int { return int(s.held.Load()) }

// storeHeld publishes curCount + oldCount for Held; s.mu is held for
// writing.
func (s *Summary) storeHeld() { s.held.Store(int64(s.curCount + s.oldCount)) }

// estimateAdds is the number of keys that set the bits of a generation's
// words, from the share of its bits set: k bits per key over m bits set
// a share 1 - exp(-k·n/m) of them (the blocked filter's spread differs
// little at the fill a generation rotates at).
func estimateAdds(words []uint64, g geometry) int {
	set := 0
	for _, w := range words {
		set += bits.OnesCount64(w)
	}
	if set == 0 {
		return 0
	}
	frac := min(float64(set)/float64(g.m), 1-1.0/float64(g.m))
	return int(math.Round(-float64(g.m) / float64(g.k) * math.Log1p(-frac)))
}

// Has reports whether the summary (probably) holds the block.
func (s *Summary) Has(h uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.has(probeOf(h))
}

func (s *Summary) has(p Probe) bool { return s.hasKey(s.geo.key(p)) }

func (s *Summary) hasKey(key uint64) bool {
	base, bits := s.geo.locate(key)
	newer, older := s.words[s.cur], s.words[1-s.cur]
	// Load the first position's word of both generations before either
	// is tested: two independent loads, so their cache misses overlap
	// (over a thousand replicas a decision is bound by these misses), and
	// both blocks are in cache for the full tests.
	pos := bits & (blockBits - 1)
	i, bit := base+pos>>6, uint64(1)<<(pos&63)
	wn, wo := newer[i], older[i]
	if wn&bit == 0 && wo&bit == 0 {
		return false
	}
	if !test(newer, s.geo, base, bits) && !test(older, s.geo, base, bits) {
		return false
	}
	if len(s.neg) > 0 {
		if _, ok := s.neg[key]; ok {
			return false
		}
	}
	return true
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

// ErrGap is returned by ApplyDelta when a delta does not reach the copy's
// version or is of another epoch: the copy needs a full summary (or the
// deltas before this one).
var ErrGap = errors.New("summary: delta does not follow this copy")

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
	// Forgotten is the size of the negative record, ForgetLimit its
	// bound (forgets past it are refused).
	Forgotten   int `json:"forgotten"`
	ForgetLimit int `json:"forget_limit"`
	// PatternBits is the width of a key's pattern (see geometry).
	PatternBits int `json:"pattern_bits"`
}

// Stats returns the summary's size and position.
func (s *Summary) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return Stats{
		MaxBlocks: 2 * s.geo.perGen,
		Epoch:     s.epoch, Version: s.version, CapacityBlocks: s.params.CapacityBlocks,
		NewerInserts: s.curCount, Bytes: encodedSize(s.geo, len(s.neg)), Forgotten: len(s.neg), ForgetLimit: maxNegOf(s.geo),
		PatternBits: int(s.geo.pat),
	}
}
