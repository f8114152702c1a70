package summary

import (
	"math/bits"
	"sync/atomic"
)

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

// mirrorOf returns s's column in x, nil when it has none there.
func (x *Index) mirrorOf(s *Summary) *column {
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
// fills a column for s whole, the way a summary new to the Index is.
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
	c.unbind()
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

// unbind stops c's summary mirroring into c.
func (c *column) unbind() {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mirror.Load() == c {
		s.mirror.Store(nil)
	}
}
