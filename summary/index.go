package summary

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// Index answers one request's prefix match against many summaries at
// once. A routing decision over a thousand replicas asks every summary for
// its match; probing each summary on its own costs a cache miss or two per
// summary per probe (its header, one 64-byte block per generation), and
// those misses are the decision's cost. The Index keeps a bit-sliced copy
// of the summaries that share a geometry: for every bit position of a
// generation, a row holding that bit of every summary, one bit per
// summary (its column). A probe's k positions in both generations are 2k
// rows; ANDing them gives, in a few 64-byte lines, the set of summaries
// that hold the probe. Match runs Summary.Match's gallop and bisection on
// those sets, so its answer is exactly Summary.Match's.
//
// The copy is kept current by the summaries themselves: a summary bound to
// a column sets and clears the column's bits under its own write lock, in
// the same write sections that change its words (Add, ApplyDelta, Apply,
// rotations, cuts). Match reads rows without locks (atomic loads): a match
// racing with a write may see part of an add (a miss, as if the add had
// not arrived) or of a rotation's clearing. A summary with a negative
// record (Forget) is matched by Summary.Match instead, as are summaries of
// a geometry fewer than minIndexed summaries share (the rows of a sparse
// geometry would cost more memory than its summaries).
//
// Columns are bound lazily, by Match, at most maxBindsPerMatch per call:
// binding copies the summaries' bits into their columns 64 at a time (a
// bit transpose per word, one atomic OR per row; a millisecond for 64
// summaries of 4,096 blocks). Until bound a summary is matched by
// Summary.Match. Callers that name each summary's slot (keys: a replica)
// keep one column per slot when summaries are replaced; otherwise a
// summary no Match call asks about keeps its column until the columns of
// its geometry run out, then yields it. Memory is that of the bound
// summaries' bits again, rounded up to a shard of shardCols columns.
//
// Writes cost more with an Index: an add sets k bits in the rows too (k
// atomic ORs), and a rotation clears the older generation's set bits in
// the column one by one.
//
// The zero Index is ready to use; it is safe for concurrent use.
type Index struct {
	mu     sync.Mutex
	groups []*indexGroup      // one per geometry; guarded by mu
	byKey  map[uint64]*column // the column of each key (see Match); guarded by mu
	seq    atomic.Uint64      // Match calls, for the columns' last use
	// rebinds counts columns given to another summary: a Match that
	// saw it change while reading rows may have read a column that
	// changed hands.
	rebinds atomic.Uint64
	pool    sync.Pool // *indexScratch
}

const (
	shardWords = 8               // words per row: one 64-byte line
	shardCols  = 64 * shardWords // columns per shard
	// minIndexed is the fewest summaries of one geometry in one Match
	// call for them to be indexed: the rows of a shard cost as much
	// memory as shardCols summaries, so half a shard is at most twice
	// its summaries.
	minIndexed = IndexMinSummaries
	// maxBindsPerMatch bounds the columns one Match call fills, and
	// maxStaleFills the words of columns with a former summary's bits.
	maxBindsPerMatch = 256
	maxStaleFills    = 2
)

// IndexStats describes an Index's size.
type IndexStats struct {
	// Columns is how many summaries are bound; Shards how many shards of
	// shardCols columns hold them; Bytes the shards' rows.
	Columns, Shards, Bytes int
}

// Stats returns the index's size.
func (x *Index) Stats() IndexStats {
	x.mu.Lock()
	defer x.mu.Unlock()
	var st IndexStats
	for _, g := range x.groups {
		for _, sh := range g.shards {
			st.Shards++
			st.Bytes += 8 * len(sh.rows)
			for _, c := range sh.cols {
				if c != nil {
					st.Columns++
				}
			}
		}
	}
	return st
}

// IndexMinSummaries is the fewest summaries of one geometry that an Index
// answers itself; with fewer, Index.Match calls Summary.Match for each,
// and a caller gains nothing by batching.
const IndexMinSummaries = shardCols / 2

// IndexHint is where a summary was answered in an Index the last time a
// caller asked: MatchHinted checks it against the shard's record of its
// columns, one contiguous array, instead of reading the summary's header
// and its column, two cache misses per summary that made most of a
// decision's matching once its caches were cold (after a context switch
// on a loaded machine: 48 µs of 58 at 1,024 summaries). The zero value
// knows nothing.
type IndexHint struct {
	sh  *shard
	col int32
}

// shardReq is one Match call's work on one shard: the columns asked and
// where each answer goes.
type shardReq struct {
	sh   *shard
	cols mask
	out  [shardCols]int32 // index into the call's dst, for the asked columns
}

type indexScratch struct {
	reqs    []*shardReq
	direct  []int32    // indexes of summaries matched by Summary.Match
	unb     []int32    // indexes of unbound summaries
	locs    []probeLoc // the probes' locations in the current shard's geometry
	have    []bool
	claimed []*column
}

// probeLoc is a probe's place in one geometry: its block's first word and
// its bit positions.
type probeLoc struct{ base, bits uint64 }

// Match sets dst[i] to sums[i].Match(probes) for every i (nil summaries
// get 0) and returns dst[:len(sums)], reallocated when dst is shorter.
//
// keys, when not nil, names the slot each summary fills (a replica): a
// summary that replaces another under the same key (a full copy, a new
// owner's summary) takes over its column, so the columns stay as many as
// the keys. Without keys a new summary takes a free column and the old
// one's column is reclaimed once no Match asked about it for a while.
func (x *Index) Match(dst []int, sums []*Summary, keys []uint64, probes []Probe) []int {
	return x.MatchHinted(dst, sums, keys, nil, probes)
}

// MatchHinted is Match with hints, when not nil, of the same length as
// sums: hints[i] is where sums[i] was answered by an earlier call with
// these hints (the caller keeps them from call to call, for summaries
// that tend to come back at the same place: a view's replicas), and is
// set here for the next call. A wrong or stale hint costs a check.
func (x *Index) MatchHinted(dst []int, sums []*Summary, keys []uint64, hints []IndexHint, probes []Probe) []int {
	return x.MatchPlanned(dst, sums, keys, hints, nil, probes)
}

// MatchPlanned is MatchHinted with a plan, when not nil, that the caller
// keeps from call to call for the same set of summaries and Forgets when
// the set changes: a usable plan answers from the columns it holds (see
// IndexPlan); otherwise the call reads every summary's hint and makes the
// plan anew.
func (x *Index) MatchPlanned(dst []int, sums []*Summary, keys []uint64, hints []IndexHint, plan *IndexPlan, probes []Probe) []int {
	if cap(dst) < len(sums) {
		dst = make([]int, len(sums))
	}
	dst = dst[:len(sums)]
	// Every answer is 0 unless found below: one clear, rather than each
	// column's answer written apart (a thousand scattered stores).
	clear(dst)
	if len(probes) == 0 {
		return dst
	}
	seq := x.seq.Add(1)
	// Read before any mirror: a column given to another summary after
	// this shows in the count, one given before shows in the mirrors.
	rebinds := x.rebinds.Load()
	sc, _ := x.pool.Get().(*indexScratch)
	if sc == nil {
		sc = &indexScratch{}
	}
	sc.reqs, sc.direct, sc.unb = sc.reqs[:0], sc.direct[:0], sc.unb[:0]
	if plan.usable(x, len(sums)) {
		// rebinds is the plan's: no column changed hands since it was
		// made, so each of its columns still mirrors its summary.
		sc.direct = append(sc.direct, plan.direct...)
		x.matchReqs(sc, plan.reqs, sums, probes, dst, seq%dateEvery == 0, seq, rebinds)
		if len(sc.direct) > len(plan.direct) {
			plan.Forget() // a column changed hands meanwhile
		}
		x.pool.Put(sc)
		return dst
	}
	for i, s := range sums {
		if hints != nil && s != nil {
			if h := hints[i]; h.sh != nil && h.sh.idx == x && h.sh.owners[h.col].Load() == s {
				switch col := int(h.col); {
				case h.sh.negs[col>>6].Load()&(1<<(col&63)) != 0:
					sc.direct = append(sc.direct, int32(i))
				default:
					r := sc.req(h.sh)
					r.cols[col>>6] |= 1 << (col & 63)
					r.out[col] = int32(i)
				}
				continue
			}
		}
		c := x.mirrorOf(s)
		if hints != nil {
			hints[i] = IndexHint{}
			if c != nil {
				hints[i] = IndexHint{sh: c.sh, col: int32(c.col)}
			}
		}
		switch {
		case s == nil: // 0
		case c == nil:
			sc.unb = append(sc.unb, int32(i))
		case s.negN.Load() != 0:
			sc.direct = append(sc.direct, int32(i))
		default:
			r := sc.req(c.sh)
			r.cols[c.col>>6] |= 1 << (c.col & 63)
			r.out[c.col] = int32(i)
		}
	}
	date, binds := seq%dateEvery == 0, false
	if len(sc.unb) > 0 {
		for _, i := range sc.unb {
			binds = binds || sums[i].negN.Load() == 0
		}
		rebinds, date = x.bookkeep(sc, sums, keys, seq), false // it dates them
	}
	direct := len(sc.direct)
	if binds {
		// Summaries this call may bind have no hint yet: the plan is
		// made by the next call, which sets them, so that the hints
		// serve when the plan is forgotten.
		plan.Forget()
	} else if plan != nil {
		asked := 0
		for _, r := range sc.reqs {
			for _, m := range r.cols {
				asked += bits.OnesCount64(m)
			}
		}
		plan.record(x, sc.reqs, sc.direct, sums, asked, rebinds)
	}
	x.matchReqs(sc, sc.reqs, sums, probes, dst, date, seq, rebinds)
	if plan != nil && len(sc.direct) > direct {
		plan.Forget() // a column changed hands meanwhile
	}
	for _, r := range sc.reqs {
		r.sh = nil
	}
	x.pool.Put(sc)
	return dst
}

// matchReqs answers the summaries of reqs from their columns' rows, and
// those of sc.direct (and every one of reqs when a column changed hands
// since rebinds was read) with Summary.Match; with date it dates the
// columns asked as of seq (every dateEvery calls).
func (x *Index) matchReqs(sc *indexScratch, reqs []*shardReq, sums []*Summary, probes []Probe, dst []int, date bool, seq, rebinds uint64) {
	if len(reqs) > 0 && date {
		x.date(reqs, seq)
	}
	for _, r := range reqs {
		x.matchShard(sc, r, probes, dst)
	}
	if x.rebinds.Load() != rebinds {
		// A column changed hands while rows were read (another call
		// reclaimed it): match the indexed summaries directly.
		for _, r := range reqs {
			for w, m := range r.cols {
				for ; m != 0; m &= m - 1 {
					sc.direct = append(sc.direct, r.out[w*64+trailingZeros(m)])
				}
			}
		}
	}
	for _, i := range sc.direct {
		dst[i] = sums[i].Match(probes)
	}
}

// matchShard runs Summary.Match's gallop and bisection on every asked
// column of r at once, on sets of columns, and writes the answers
// found (dst holds 0 for the others).
func (x *Index) matchShard(sc *indexScratch, r *shardReq, probes []Probe, dst []int) {
	n := len(probes)
	if cap(sc.locs) < n {
		sc.locs, sc.have = make([]probeLoc, n), make([]bool, n)
	}
	sc.locs, sc.have = sc.locs[:n], sc.have[:n]
	clear(sc.have)
	m := &matcher{sh: r.sh, probes: probes, locs: sc.locs, have: sc.have, r: r, dst: dst}
	alive := m.held(0, &r.cols)
	lo, step := 0, 1
	for !alive.empty() {
		next := lo + step
		if next >= n {
			m.bisect(alive, lo, n)
			break
		}
		h := m.held(next, &alive)
		var missed mask
		for w := range missed {
			missed[w] = alive[w] &^ h[w]
		}
		m.bisect(missed, lo, next)
		alive, lo, step = h, next, 2*step
	}
}

type matcher struct {
	sh     *shard
	probes []Probe
	locs   []probeLoc
	have   []bool
	r      *shardReq
	dst    []int
}

// held returns the columns of in whose summaries hold probe i.
func (m *matcher) held(i int, in *mask) mask {
	g := &m.sh.geo
	if !m.have[i] {
		m.locs[i].base, m.locs[i].bits = g.locate(g.key(m.probes[i]))
		m.have[i] = true
	}
	l := m.locs[i]
	var out mask
	rows := m.sh.rows
	gen0 := l.base * 64 // row of the block's first bit in generation 0
	gen1 := gen0 + uint64(g.m)
	for w := range in {
		if in[w] == 0 {
			continue
		}
		a0, a1 := in[w], in[w]
		bits := l.bits
		for range g.k {
			pos := bits & (blockBits - 1)
			a0 &= atomic.LoadUint64(&rows[(gen0+pos)*shardWords+uint64(w)])
			a1 &= atomic.LoadUint64(&rows[(gen1+pos)*shardWords+uint64(w)])
			if a0|a1 == 0 {
				break
			}
			bits >>= 9
		}
		out[w] = a0 | a1
	}
	return out
}

// bisect finds the match of the columns in set, each holding probe lo
// and not probe hi (or hi == len(probes)), as Summary.Match's bisection.
func (m *matcher) bisect(set mask, lo, hi int) {
	if set.empty() {
		return
	}
	if hi-lo <= 1 {
		for w := range set {
			for b := set[w]; b != 0; b &= b - 1 {
				m.dst[m.r.out[w*64+trailingZeros(b)]] = lo + 1
			}
		}
		return
	}
	mid := int(uint(lo+hi) >> 1)
	h := m.held(mid, &set)
	var miss mask
	for w := range miss {
		miss[w] = set[w] &^ h[w]
	}
	m.bisect(h, mid, hi)
	m.bisect(miss, lo, mid)
}
