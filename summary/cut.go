package summary

// Generation cuts: the lasting half of self-correction.
//
// A Forget only hides the blocks the engine was found not to hold, and the
// proxy records them again at once (the engine just recomputed them). What
// a miss really shows is about the summary's other claims: the engine's
// cache evicted a block the summary still remembers, so the summary
// remembers further back than the cache holds. Where the forgotten block
// was tells how far:
//
//   - Only in the older generation: the engine's horizon is somewhere in
//     the older generation. That is expected of a well-sized summary (it
//     remembers 0.75 to 1.5 capacities, an LRU holds one, erring long on
//     purpose), so it cuts nothing: dropping the older generation there
//     drops the part the engine still holds too (measured: rotating early
//     on such misses once the capacity was found smaller cost 1.2 to 3.3%
//     of the hit ratio on the conversation trace).
//   - In the newer generation (and not among the adds made since the
//     prediction): the engine holds less than the newer generation's
//     inserts, under 3/4 of the assumed capacity (the capacity is smaller
//     than assumed, other tenants use the cache, or the engine restarted
//     empty). The older generation is certainly stale: drop it (a
//     rotation, early), and lower the rotation threshold to 3/4 of the
//     newer generation's inserts (bounded below by a sixteenth of the
//     assumed generation), so the summary remembers about what the engine
//     holds from then on.
//
// Measured (DESIGN.md, Summaries): with summaries sized for 2× or 4× the
// engines' cache this keeps the hit ratio of the correctly sized summary
// and lowers mean and p99 TTFT; cutting more (the older generation on
// misses in it, or without lowering the threshold) cost 1 to 7% of the
// hit ratio, because a summary that errs long costs little (DESIGN.md).
// Cut(CutBoth) is there for a caller that knows the engine restarted
// empty; no miss alone triggers it.
//
// Cuts are rotations in the ordered log, which copies already replay where
// the owner logged them, so copies stay bit-identical and the delta format
// is unchanged. The threshold is the owner's alone: copies never rotate by
// themselves (they follow the rotation entries), and a new owner starts
// again from the assumed capacity. A rotation of a full newer generation
// that saw no newer-generation miss raises a lowered threshold by a
// sixteenth of the assumed one, so a cache that grows back (a tenant
// left) is followed, slowly.
//
// Only evidence counts: a miss must cover at least minEvidentKeys claimed
// keys and 3/4 of the blocks beyond the report (a Match that ran past the
// real end of a prefix on false positives claims a few scattered keys),
// and a block recorded after the prediction counts where it was before
// (noteAdd).

// Cut names the generations a cut drops.
type Cut int

// The cuts.
const (
	CutNone  Cut = iota
	CutOlder     // drop the older generation: one rotation entry
	CutBoth      // drop both: two rotation entries
)

func (c Cut) String() string {
	switch c {
	case CutOlder:
		return "older"
	case CutBoth:
		return "both"
	}
	return "none"
}

// cutState is the owner's correction state. It is not encoded: a copy
// that becomes the owner starts from the assumed capacity.
type cutState struct {
	limit  int  // rotation threshold when lowered; 0 means geo.perGen
	missed bool // the newer generation saw a miss: no growth at its fill
	// The most recent adds to the newer generation and where each key was
	// before (see noteAdd): recent maps a key to its slot in ring << 1 |
	// 1 if it was in the older generation alone.
	recent map[uint64]uint32
	ring   []uint64
	next   int
}

// recentOf is how many recent adds the owner remembers the origin of:
// enough for the adds of the requests in flight between a prediction and
// the engine's report.
func recentOf(g geometry) int { return min(max(g.perGen/4, 256), 1<<16) }

// noteAdd remembers where a key was before Add put it in the newer
// generation. A miss is reported after the request was recorded (the
// proxy records on acceptance), so by then its blocks are all in the
// newer generation: where the summary held them when it predicted the
// match is what tells how far back the engine's cache reaches.
// newer and older are the generations' words.
func (c *cutState) noteAdd(newer, older []uint64, g geometry, key, base, bits uint64, forgotten bool) {
	if forgotten && test(newer, g, base, bits) {
		return // un-forgetting: it stays where it was
	}
	if c.recent == nil {
		c.recent = make(map[uint64]uint32)
		c.ring = make([]uint64, 0, recentOf(g))
	}
	v := uint32(c.next) << 1
	if test(older, g, base, bits) {
		v |= 1
	}
	if len(c.ring) < cap(c.ring) {
		c.ring = append(c.ring, key)
	} else {
		old := c.ring[c.next]
		if w, ok := c.recent[old]; ok && int(w>>1) == c.next {
			delete(c.recent, old)
		}
		c.ring[c.next] = key
	}
	c.recent[key] = v
	c.next = (c.next + 1) % cap(c.ring)
}

// Found is where the summary finds blocks it claims.
type Found struct {
	Newer     int // claimed by the newer generation
	OlderOnly int // claimed by the older generation alone
}

// Correction is what Correct found and did.
type Correction struct {
	Found
	Cut Cut
	// Forgot is the number of forgets logged after the cut (blocks the
	// summary still claimed).
	Forgot int
	// RotateAt is the rotation threshold after the correction.
	RotateAt int
}

// minRotateAtOf is the floor of the learned threshold: a sixteenth of the
// assumed capacity's generation, so a burst of misses cannot make the
// summary useless.
func minRotateAtOf(g geometry) int { return max(g.perGen/16, 1) }

// rotateAt is the newer generation's size at which Add rotates.
func (c *cutState) rotateAt(g geometry) int {
	if c.limit > 0 {
		return c.limit
	}
	return g.perGen
}

// minEvidentKeys is the fewest claimed keys a miss must cover to count.
const minEvidentKeys = 2

// filled is called after Add rotated a full newer generation: a new
// generation begins, and a lowered threshold grows back by a sixteenth of
// the assumed one if the generation saw no miss.
func (c *cutState) filled(g geometry) {
	grow := !c.missed
	c.missed = false
	if c.limit > 0 && grow {
		c.limit += max(g.perGen/16, 1)
		if c.limit >= g.perGen {
			c.limit = 0
		}
	}
}

// Where reports where the summary finds the blocks with these hashes
// (forgotten blocks count nowhere).
func (s *Summary) Where(hashes []uint64) Found {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.whereLocked(hashes)
}

func (s *Summary) whereLocked(hashes []uint64) Found {
	var f Found
	for _, h := range hashes {
		key := s.geo.key(probeOf(h))
		if _, gone := s.neg[key]; gone {
			continue
		}
		base, bits := s.geo.locate(key)
		switch {
		case test(s.words[s.cur], s.geo, base, bits):
			if v, ok := s.cut.recent[key]; ok {
				// Added recently: count it where it was before (a
				// block that was nowhere is no claim the engine
				// contradicts: recorded after the prediction, or a
				// false positive).
				if v&1 != 0 {
					f.OlderOnly++
				}
				continue
			}
			f.Newer++
		case test(s.words[1-s.cur], s.geo, base, bits):
			f.OlderOnly++
		}
	}
	return f
}

// Cut drops generations now and logs the rotations, so copies drop the
// same ones. It returns the number of log entries.
func (s *Summary) Cut(which Cut) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cutLocked(which)
}

func (s *Summary) cutLocked(which Cut) int {
	n := 0
	switch which {
	case CutOlder:
		n = 1
	case CutBoth:
		n = 2
	}
	for range n {
		s.rotate()
		s.version++
		s.record(opRotate)
	}
	return n
}

// Correct is the owner's correction for a miss: the engine reported fewer
// cached blocks than predicted, and hashes are the blocks the summary
// claimed beyond the report, in chain order. It finds where the summary
// holds them, cuts generations as the file comment describes, then
// forgets what the summary still claims of them (as Forget).
func (s *Summary) Correct(hashes []uint64) Correction {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Correction{Found: s.whereLocked(hashes)}
	// A claim is evidence only when the summary claims (nearly) the whole
	// range, as it does a prefix it recorded: a Match past the real end
	// of a prefix through false positives claims a few scattered keys.
	evident := func(n int) bool { return n >= minEvidentKeys && 4*n >= 3*len(hashes) }
	if evident(c.Newer) {
		s.cut.limit = max(min(s.cut.rotateAt(s.geo), s.curCount*3/4), minRotateAtOf(s.geo))
		if s.cut.limit >= s.geo.perGen {
			s.cut.limit = 0
		}
		s.cut.missed = true
		if s.curCount >= s.cut.rotateAt(s.geo) {
			c.Cut = CutOlder
		}
	}
	if s.cutLocked(c.Cut) > 0 {
		s.cut.missed = false // the miss was in the generation now older
	}
	c.Forgot, _ = s.forgetLocked(hashes)
	c.RotateAt = s.cut.rotateAt(s.geo)
	return c
}
