package route

import "github.com/kvmesh/kvmesh/summary"

// BatchMatcher answers the prefix matches of a batch of summaries at once
// (the mesh's bit-sliced Index over a thousand replicas reads a few
// hundred cache lines for all of them, where asking each summary costs a
// miss or two per replica).
type BatchMatcher interface {
	// MatchBatch returns dst, grown when short, holding the match of
	// each summary of the batch for probes, in the batch's order.
	MatchBatch(dst []int, probes []summary.Probe) []int
}

// Batch is the matches of many candidates computed together: each
// candidate's Summary is one of its cells (Cell), and the first Match
// asked of any cell computes the answer of all of them through the
// batch's BatchMatcher. Pick reads a cell's answer from the batch
// directly, without a call per candidate (a thousand interface calls,
// each checking the probes, were a third of its first pass). A caller
// that rewrites a probes slice in place and asks the same cells again
// must pass a different slice (or Reset the batch): the batch recognises
// probes by their slice, first and last. A Batch and its cells are for
// one goroutine at a time, as a request's candidates are.
type Batch struct {
	src   BatchMatcher
	cells []BatchCell
	res   []int
	// The probes res answers: the caller's slice, its first and last.
	probes      []summary.Probe
	first, last summary.Probe
	valid       bool
}

// Reset readies b for n cells answered by src, keeping its storage, and
// forgets its answer. The cells are written once, not per call: each is
// its place in b, which they keep while b stays where it is.
func (b *Batch) Reset(src BatchMatcher, n int) {
	if b.src != src {
		b.src = src
	}
	if cap(b.cells) < n || (n > 0 && b.cells[:1][0].b != b) {
		b.cells = make([]BatchCell, max(n, cap(b.cells)))
		for i := range b.cells {
			b.cells[i] = BatchCell{b: b, i: i}
		}
	}
	b.cells = b.cells[:n]
	b.probes, b.valid = nil, false
}

// Cell is the Matcher of the batch's i-th summary (i below Reset's n).
func (b *Batch) Cell(i int) *BatchCell { return &b.cells[i] }

// BatchCell is one candidate's Matcher in a Batch.
type BatchCell struct {
	b *Batch
	i int
}

// Match is the batch's answer for this cell's summary, computed for
// every cell of the batch on the first call with these probes.
func (c *BatchCell) Match(probes []summary.Probe) int {
	return c.b.answer(probes)[c.i]
}

// answer is the batch's matches for probes, computed unless it holds
// them.
func (b *Batch) answer(probes []summary.Probe) []int {
	if !b.answers(probes) {
		b.res = b.src.MatchBatch(b.res, probes)
		b.probes, b.valid = probes, true
		if len(probes) > 0 {
			b.first, b.last = probes[0], probes[len(probes)-1]
		}
	}
	return b.res
}

func (b *Batch) answers(probes []summary.Probe) bool {
	switch {
	case !b.valid || len(probes) != len(b.probes):
		return false
	case len(probes) == 0:
		return true
	}
	return &probes[0] == &b.probes[0] && probes[0] == b.first && probes[len(probes)-1] == b.last
}
