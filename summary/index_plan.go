package summary

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
