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

type indexGroup struct {
	geo    geometry
	shards []*shard
}

// shard is the rows of up to shardCols summaries of one geometry. Row r of
// generation g (g is the summary's physical generation, 0 or 1) is
// rows[(g*m + r)*shardWords:][:shardWords]; column c is bit c%64 of word
// c/64.
type shard struct {
	geo  geometry
	rows []uint64
	// Guarded by Index.mu.
	cols    [shardCols]*column
	lastUse [shardCols]uint64 // Index.seq of a recent Match that asked (see dateEvery)
	// dirty marks columns holding a former summary's bits (unbind leaves
	// them; no Match reads a column without a summary): fill clears them.
	dirty mask

	idx *Index
	// owners is the summary each column mirrors, set once its bits are
	// all in (fill, handOverLocked) and cleared before they change hands
	// (releaseLocked): what an IndexHint is checked against, in one
	// contiguous array instead of each summary and its column. negs marks
	// the columns whose summary has a negative record (kept by the
	// summary under its write lock, setNegN).
	owners [shardCols]atomic.Pointer[Summary]
	negs   [shardWords]atomic.Uint64
}

// publish makes col's summary s known to hints (the caller holds s's
// lock, and col's bits are all in).
func (sh *shard) publish(col int, s *Summary) {
	sh.setNeg(col, s.negN.Load() != 0)
	sh.owners[col].Store(s)
}

// setNeg records whether col's summary has a negative record.
func (sh *shard) setNeg(col int, on bool) {
	bit := uint64(1) << (col & 63)
	if on {
		sh.negs[col>>6].Or(bit)
	} else {
		sh.negs[col>>6].And(^bit)
	}
}

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

// column is one summary's place in a shard.
type column struct {
	idx    *Index
	sh     *shard
	col    int
	s      *Summary
	key    uint64 // the caller's name of the slot s fills (see Match)
	hasKey bool
	asked  int32 // scratch of the Match that binds it: the summary's index
}

// set mirrors a set of a key's bits in generation gen: those of its
// positions that fresh marks (bit i for the i-th, see the summary's set).
func (c *column) set(gen int, base, bits, fresh uint64) {
	g := c.sh.geo
	word, bit := uint64(c.col>>6), uint64(1)<<(c.col&63)
	row0 := uint64(gen)*uint64(g.m) + base*64
	for i := uint(0); i < g.k; i++ {
		if fresh&(1<<i) != 0 {
			pos := bits & (blockBits - 1)
			atomic.OrUint64(&c.sh.rows[(row0+pos)*shardWords+word], bit)
		}
		bits >>= 9
	}
}

// clear mirrors the clearing of generation gen, whose words are still
// words: only the bits set there are in the column.
func (c *column) clear(words []uint64, gen int) { c.apply(words, gen, false) }

// apply sets (or clears) in the column every bit set in words.
func (c *column) apply(words []uint64, gen int, on bool) {
	for i, w := range words {
		c.applyWord(gen, i, w, on)
	}
}

// applyWord sets (or clears) in the column the bits set in w, word i of
// generation gen.
func (c *column) applyWord(gen, i int, w uint64, on bool) {
	word, bit := uint64(c.col>>6), uint64(1)<<(c.col&63)
	row0 := uint64(gen)*uint64(c.sh.geo.m) + uint64(i)*64
	for ; w != 0; w &= w - 1 {
		r := row0 + uint64(trailingZeros(w))
		if on {
			atomic.OrUint64(&c.sh.rows[r*shardWords+word], bit)
		} else {
			atomic.AndUint64(&c.sh.rows[r*shardWords+word], ^bit)
		}
	}
}

func trailingZeros(x uint64) int { return bits.TrailingZeros64(x) }

// mask is a set of a shard's columns.
type mask [shardWords]uint64

func (m *mask) empty() bool {
	var or uint64
	for _, w := range m {
		or |= w
	}
	return or == 0
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

// IndexPlan is where an Index answered each summary of a caller's set the
// last time it asked with the plan: the columns of each shard, and each
// column's place in the set. While the set is the same (the caller's to
// tell: Forget when it changes) and no column of the Index has changed
// hands since (Index.rebinds), MatchPlanned reads the rows of the plan's
// columns straight away, without reading the hints, the shards' owners
// and the summaries of a thousand summaries and sorting them into
// shards again: a third of a decision's matching over a thousand
// replicas, most of it cache misses once other work has filled the
// caches (the scale harness). The zero value is an empty plan. A plan is
// for one goroutine at a time.
type IndexPlan struct {
	reqs []*shardReq // the caller's own, never pooled
	// direct is the summaries answered by Summary.Match (a negative
	// record): a negative record stays until the summary is replaced.
	direct  []int32
	n       int    // the set's length
	rebinds uint64 // Index.rebinds before the call that made it
	idx     *Index
	ok      bool
}

// Forget empties the plan (a nil plan is left alone): the caller's set
// of summaries changed (one replaced, added or removed), so its columns
// may be others.
func (p *IndexPlan) Forget() {
	if p != nil {
		p.ok = false
	}
}

// usable reports whether p answers a set of n summaries in x now: made
// by x for n, no column changed hands since, and none of its columns'
// summaries has a negative record (MatchHinted matches those directly).
func (p *IndexPlan) usable(x *Index, n int) bool {
	if p == nil || !p.ok || p.idx != x || p.n != n || x.rebinds.Load() != p.rebinds {
		return false
	}
	for _, r := range p.reqs {
		for w := range r.cols {
			if r.cols[w]&r.sh.negs[w].Load() != 0 {
				return false
			}
		}
	}
	return true
}

// record makes p the plan of the call whose requests are reqs, and
// direct the summaries of sums it matches directly: when every summary
// is one or the other, those matched directly for a negative record only
// (a plan would keep any other from being bound), with no column changing
// hands (rebinds, as read before the mirrors, still current); else an
// empty plan.
func (p *IndexPlan) record(x *Index, reqs []*shardReq, direct []int32, sums []*Summary, asked int, rebinds uint64) {
	p.ok = false
	if x.rebinds.Load() != rebinds {
		return
	}
	for _, i := range direct {
		if sums[i].negN.Load() == 0 {
			return
		}
	}
	if asked+len(direct) != len(sums) {
		nils := 0 // answered 0 (MatchPlanned clears dst)
		for _, s := range sums {
			if s == nil {
				nils++
			}
		}
		if asked+len(direct)+nils != len(sums) {
			return
		}
	}
	p.direct = append(p.direct[:0], direct...)
	for len(p.reqs) < len(reqs) {
		p.reqs = append(p.reqs, &shardReq{})
	}
	p.reqs = p.reqs[:len(reqs)]
	for i, r := range reqs {
		*p.reqs[i] = *r
	}
	p.n, p.rebinds, p.idx, p.ok = len(sums), rebinds, x, true
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
		c := s.mirrorOf(x)
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

// mirrorOf returns s's column in x, nil when it has none there.
func (s *Summary) mirrorOf(x *Index) *column {
	if s == nil {
		return nil
	}
	if c := s.mirror.Load(); c != nil && c.idx == x {
		return c
	}
	return nil
}

// req returns the call's request on sh, adding it.
func (sc *indexScratch) req(sh *shard) *shardReq {
	for _, r := range sc.reqs {
		if r.sh == sh {
			return r
		}
	}
	n := len(sc.reqs)
	if n < cap(sc.reqs) {
		sc.reqs = sc.reqs[:n+1]
		if r := sc.reqs[n]; r != nil {
			r.sh, r.cols = sh, mask{}
			return r
		}
	} else {
		sc.reqs = append(sc.reqs, nil)
	}
	r := &shardReq{sh: sh}
	sc.reqs[n] = r
	return r
}

// dateEvery is how often (in Match calls) a call without summaries to
// bind dates its columns' last use: enough for reclaimAfter to tell the
// columns asked from those not, without a lock in most calls.
const dateEvery = 64

// date records seq as the last use of the asked columns, under x.mu. It
// does not check that each still holds the summary asked (bookkeep does,
// reading every column's summary: a thousand cache misses once in
// dateEvery decisions): a column given to another summary since this
// call read the mirrors has moved x.rebinds, and Match then answers
// directly; dating it only keeps it from being reclaimed a while longer.
func (x *Index) date(reqs []*shardReq, seq uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range reqs {
		for w, m := range r.cols {
			for ; m != 0; m &= m - 1 {
				r.sh.lastUse[w*64+trailingZeros(m)] = seq
			}
		}
	}
}

// bookkeep, under x.mu, checks and dates the asked columns and binds up to
// maxBindsPerMatch unbound summaries of geometries with at least minIndexed
// summaries in this call; the rest go to Summary.Match. It returns
// x.rebinds as of the check.
func (x *Index) bookkeep(sc *indexScratch, sums []*Summary, keys []uint64, seq uint64) uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range sc.reqs {
		for w, m := range r.cols {
			for ; m != 0; m &= m - 1 {
				col := w*64 + trailingZeros(m)
				if c := r.sh.cols[col]; c == nil || c.s != sums[r.out[col]] {
					// Given to another summary since this call read the
					// mirror.
					r.cols[w] &^= 1 << (col & 63)
					sc.direct = append(sc.direct, r.out[col])
					continue
				}
				r.sh.lastUse[col] = seq
			}
		}
	}
	if len(sc.unb) == 0 {
		return x.rebinds.Load()
	}
	var counts []geoCount
	if len(sums) >= minIndexed {
		counts = countGeometries(sums)
	}
	// Claim columns, then fill them a word (64 columns) at a time:
	// claims come in column order, so mostly in runs of one word.
	claimed := sc.claimed[:0]
	for _, i := range sc.unb {
		s := sums[i]
		var c *column
		if len(claimed) < maxBindsPerMatch && s.negN.Load() == 0 && countOf(counts, s.geo) >= minIndexed {
			if keys != nil {
				var bound bool
				if c, bound = x.claimKeyLocked(s, keys[i], seq, len(sums)); bound {
					r := sc.req(c.sh)
					r.cols[c.col>>6] |= 1 << (c.col & 63)
					r.out[c.col] = i
					continue
				}
			} else {
				c = x.claimLocked(s, seq, len(sums))
			}
		}
		if c == nil {
			sc.direct = append(sc.direct, i)
			continue
		}
		c.asked = i
		claimed = append(claimed, c)
	}
	staleFills := 0
	for i := 0; i < len(claimed); {
		j := i + 1
		for j < len(claimed) && claimed[j].sh == claimed[i].sh && claimed[j].col>>6 == claimed[i].col>>6 {
			j++
		}
		sh, w := claimed[i].sh, claimed[i].col>>6
		var cols uint64
		for _, c := range claimed[i:j] {
			cols |= 1 << (c.col & 63)
		}
		if sh.dirty[w]&cols != 0 {
			// Clearing a former summary's bits rewrites every row of the
			// word (~1 ms at 4,096 blocks): a few per call, the rest
			// next time (a push/pull can replace a hundred copies at once).
			if staleFills == maxStaleFills {
				for _, c := range claimed[i:j] {
					x.dropClaimLocked(c)
					sc.direct = append(sc.direct, c.asked)
				}
				i = j
				continue
			}
			staleFills++
		}
		sh.fill(w, claimed[i:j])
		for _, c := range claimed[i:j] {
			if c.s.mirror.Load() != c { // bound to another Index meanwhile
				x.dropClaimLocked(c)
				sc.direct = append(sc.direct, c.asked)
				continue
			}
			r := sc.req(c.sh)
			r.cols[c.col>>6] |= 1 << (c.col & 63)
			r.out[c.col] = int32(c.asked)
		}
		i = j
	}
	clear(claimed)
	sc.claimed = claimed[:0]
	return x.rebinds.Load()
}

type geoCount struct {
	g geometry
	n int
}

func countGeometries(sums []*Summary) []geoCount {
	var out []geoCount
next:
	for _, s := range sums {
		if s == nil {
			continue
		}
		for j := range out {
			if out[j].g == s.geo {
				out[j].n++
				continue next
			}
		}
		out = append(out, geoCount{s.geo, 1})
	}
	return out
}

func countOf(counts []geoCount, g geometry) int {
	for _, c := range counts {
		if c.g == g {
			return c.n
		}
	}
	return 0
}

// reclaimAfter is how many Match calls a column may go unasked before its
// column is given to another summary ahead of growing the shards: its
// summary was replaced or its replica left the views (or it belongs to a
// view asked that much less often, and is bound again when asked).
const reclaimAfter = 1024

// claimLocked claims a column of s's geometry for s: a free one, else
// one not asked about in the last reclaimAfter calls, else one in a new
// shard while the geometry's columns are fewer than twice the summaries
// this call asked about (asked, a shard), else the least recently asked
// one not asked by this call. It returns nil when none is available, or
// when s mirrors into another Index. The column is empty: fill binds it.
func (x *Index) claimLocked(s *Summary, seq uint64, asked int) *column {
	if cur := s.mirror.Load(); cur != nil && cur.idx != x {
		return nil
	}
	var grp *indexGroup
	for _, g := range x.groups {
		if g.geo == s.geo {
			grp = g
		}
	}
	if grp == nil {
		grp = &indexGroup{geo: s.geo}
		x.groups = append(x.groups, grp)
	}
	sh, col, lruUse := grp.freeColumn(seq)
	switch {
	case sh != nil && (sh.cols[col] == nil || lruUse+reclaimAfter < seq):
	case len(grp.shards)*shardCols < 2*asked+shardCols:
		sh = &shard{geo: s.geo, rows: make([]uint64, 2*uint64(s.geo.m)*shardWords), idx: x}
		mapRows(sh.rows)
		grp.shards = append(grp.shards, sh)
		col = 0
	case sh == nil:
		return nil
	}
	if old := sh.cols[col]; old != nil {
		x.releaseLocked(old)
	}
	c := &column{idx: x, sh: sh, col: col, s: s}
	sh.cols[col], sh.lastUse[col] = c, seq
	return c
}

// mapRows reads one word of every page of a shard's new rows. Fresh from
// the OS, their pages are not mapped until touched, and most rows are
// first touched by a Match reading them (a probe's rows are random):
// that Match took a page fault for each, several per decision for the
// first minutes of a router's Index (the scale harness: 42% of its
// decisions under load, 5 faults each, in MatchHinted). A read maps
// the kernel's shared zero page, which costs no memory until the row
// is written.
func mapRows(rows []uint64) {
	const pageWords = 4096 / 8
	for i := 0; i < len(rows); i += pageWords {
		atomic.LoadUint64(&rows[i])
	}
}

// claimKeyLocked is claimLocked for the slot key: the column of the
// summary key named before, when of s's geometry, else a new one. The
// column of the summary s replaces is handed over bound (bound true, see
// handOverLocked) when it can be; any other is empty, for fill.
func (x *Index) claimKeyLocked(s *Summary, key, seq uint64, asked int) (c *column, bound bool) {
	if old := x.byKey[key]; old != nil {
		if old.sh.geo == s.geo && old.s != s {
			if cur := s.mirror.Load(); cur != nil && cur.idx != x {
				return nil, false
			}
			if c := x.handOverLocked(old, s, seq); c != nil {
				return c, true
			}
			x.releaseLocked(old)
			c := &column{idx: x, sh: old.sh, col: old.col, s: s, key: key, hasKey: true}
			c.sh.cols[c.col], c.sh.lastUse[c.col] = c, seq
			x.byKey[key] = c
			return c, false
		}
		x.releaseLocked(old)
	}
	c = x.claimLocked(s, seq, asked)
	if c != nil {
		if x.byKey == nil {
			x.byKey = map[uint64]*column{}
		}
		c.key, c.hasKey = key, true
		x.byKey[key] = c
	}
	return c, false
}

// handOverLocked binds s to the column of old, the summary s replaces
// under the same key (a full copy of a replica's summary, a new owner's),
// by rewriting only the bits in which their words differ: a full copy
// that repairs a copy differs from it in a few words, and rewriting the
// whole column (fill of a stale column) costs about a millisecond at
// 4,096 blocks, which a push/pull replacing a hundred copies would put on
// the next decisions. It returns nil, with nothing changed, when s's lock
// is taken (a writer, or another Index's fill: never wait on it while
// holding old's) or s is bound already; the caller then releases old and
// fills the column as before.
//
// Holding old's summary's write lock, it unbinds old (its writes stop
// mirroring; its words stay those the column holds), then counts a
// rebind before touching a row: a Match that read old's mirror before
// sees the count move and matches directly. s's read lock holds its words
// still while the column is rewritten; s becomes the column's mirror only
// after, so no Match reads the column for s half rewritten (one that
// finds s unbound waits on x.mu for bookkeep).
func (x *Index) handOverLocked(old *column, s *Summary, seq uint64) *column {
	o := old.s
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mirror.Load() != old || !s.mu.TryRLock() {
		return nil
	}
	defer s.mu.RUnlock()
	if s.mirror.Load() != nil {
		return nil
	}
	o.mirror.Store(nil)
	old.sh.owners[old.col].CompareAndSwap(o, nil)
	x.rebinds.Add(1)
	c := &column{idx: x, sh: old.sh, col: old.col, s: s, key: old.key, hasKey: true}
	for g := range 2 {
		ow, sw := o.words[g], s.words[g]
		for i, w := range sw {
			if d := w ^ ow[i]; d != 0 {
				c.applyWord(g, i, w&d, true)
				c.applyWord(g, i, ow[i]&d, false)
			}
		}
	}
	c.sh.cols[c.col], c.sh.lastUse[c.col] = c, seq
	x.byKey[c.key] = c
	s.mirror.Store(c)
	c.sh.publish(c.col, s)
	return c
}

// dropClaimLocked frees c, claimed but not filled.
func (x *Index) dropClaimLocked(c *column) {
	if c.sh.cols[c.col] == c {
		c.sh.cols[c.col] = nil
	}
	if c.hasKey && x.byKey[c.key] == c {
		delete(x.byKey, c.key)
	}
}

// releaseLocked frees c: its summary stops mirroring into it, and its bits
// stay until fill clears them for the next.
func (x *Index) releaseLocked(c *column) {
	c.s.unbind(c)
	c.sh.owners[c.col].CompareAndSwap(c.s, nil)
	if c.sh.cols[c.col] == c {
		c.sh.cols[c.col] = nil
		c.sh.dirty[c.col>>6] |= 1 << (c.col & 63)
	}
	if c.hasKey && x.byKey[c.key] == c {
		delete(x.byKey, c.key)
	}
	// In this order: a Match that still found c as its summary's mirror
	// read x.rebinds before this count, and sees it changed after.
	x.rebinds.Add(1)
}

// fill binds the columns cols, all in word w of sh's rows: it copies their
// summaries' bits into them, 64 columns per row at a time (a 64×64 bit
// transpose per word of the generations, one atomic OR per row), and makes
// each column its summary's mirror. It holds the summaries' read locks
// throughout, so no writer runs between the copy and the mirror; a
// column becomes its summary's mirror only once its bits are all in, so
// a Match on another goroutine that finds the mirror never reads a column
// half filled (or still holding part of a former summary's bits). A
// summary that has a mirror already (another Index) is skipped: its
// column's summary does not point back to it, and a column filled for a
// summary another Index bound meanwhile is left dirty.
func (sh *shard) fill(w int, cols []*column) {
	var buf [64]*column
	bound := buf[:0]
	for _, c := range cols {
		c.s.mu.RLock()
		if c.s.mirror.Load() != nil {
			c.s.mu.RUnlock()
			continue
		}
		bound = append(bound, c)
	}
	defer func() {
		for _, c := range bound {
			c.s.mu.RUnlock()
		}
	}()
	defer func() { // under the summaries' locks, once their bits are in
		for _, c := range bound {
			if !c.s.mirror.CompareAndSwap(nil, c) {
				sh.dirty[w] |= 1 << (c.col & 63)
				continue
			}
			sh.publish(c.col, c.s)
		}
	}()
	// Columns that held another summary's bits: every row is rewritten.
	var stale uint64
	for _, c := range cols {
		stale |= sh.dirty[w] & (1 << (c.col & 63))
	}
	sh.dirty[w] &^= stale
	var in [64]uint64
	nw := int(sh.geo.m / 64)
	for g := range 2 {
		row0 := g * int(sh.geo.m)
		for wi := range nw {
			var any uint64
			for _, c := range bound {
				v := c.s.words[g][wi]
				in[c.col&63] = v
				any |= v
			}
			if any == 0 && stale == 0 {
				continue
			}
			if any != 0 {
				transpose64(&in)
			}
			for j, v := range in {
				row := &sh.rows[(row0+wi*64+j)*shardWords+w]
				if stale != 0 {
					atomic.AndUint64(row, ^stale)
				}
				if v != 0 {
					atomic.OrUint64(row, v)
				}
			}
			clear(in[:])
		}
	}
}

// transpose64 transposes a 64×64 bit matrix in place: bit j of a[i]
// becomes bit i of a[j].
func transpose64(a *[64]uint64) {
	m := uint64(0x00000000ffffffff)
	for j := 32; j != 0; j, m = j>>1, m^(m<<(j>>1)) {
		for k := 0; k < 64; k = (k + j + 1) &^ j {
			t := (a[k]>>j ^ a[k+j]) & m
			a[k] ^= t << j
			a[k+j] ^= t
		}
	}
}

// freeColumn returns a free column, else the least recently asked one
// not asked by the current call (and its last use), or nil.
func (g *indexGroup) freeColumn(seq uint64) (*shard, int, uint64) {
	var lru *shard
	lruCol, lruUse := 0, seq
	for _, sh := range g.shards {
		for c := range sh.cols {
			switch {
			case sh.cols[c] == nil:
				return sh, c, 0
			case sh.lastUse[c] < lruUse:
				lru, lruCol, lruUse = sh, c, sh.lastUse[c]
			}
		}
	}
	return lru, lruCol, lruUse
}

// unbind stops s mirroring into c.
func (s *Summary) unbind(c *column) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mirror.Load() == c {
		s.mirror.Store(nil)
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
