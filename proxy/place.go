package proxy

import (
	"cmp"
	"fmt"
	"runtime/debug"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
	"github.com/zeebo/xxh3"
)

// decideAndBook makes the decision of one attempt (a forwarded request's
// first is its hint, which the deciding router counted) and books its
// request before the next decision of this router reads the loads: the
// decisions computed alongside it are caught up (placeBook). The
// attempt ends the booking. counted tells whether the request's decision
// was counted yet.
func (st *reqState) decideAndBook(counted *bool) (route.Decision, booking) {
	p := st.p
	var d route.Decision
	decided := st.hinted < 0
	if !decided {
		d = route.Decision{Index: st.hinted, Match: st.hintMatch}
		st.hinted = -1
	} else {
		d = st.decide()
	}
	d, bk := st.commit(d, decided)
	if decided && !*counted {
		reason := d.Reason
		if st.hop {
			reason = ReasonRehint
		}
		p.m.countDecision(reason)
		p.m.countLoRA(d.LoRA)
		*counted = true
		if p.log.IsDebug() {
			c := &st.cands[d.Index]
			p.log.Debug("decision", "reason", reason, "replica", c.ID(), "match", d.Match, "blocks", len(st.hashes),
				"candidates", len(st.cands), "in_flight", c.InFlight, "running", c.Running, "waiting", c.Waiting, "slots", c.Slots,
				"pending", c.PendingPrefillBlocks, "stale", c.Stale, "client_key", st.req.ClientKey != 0)
		}
	}
	return d, bk
}

// decide picks the candidate for a request this router decides.
func (st *reqState) decide() route.Decision {
	p, req, cands := st.p, st.req, st.cands
	if st.leg == hop.LegDecode {
		return decodePick(cands, req.ClientKey^xxh3.Hash(st.body)) // pd.go
	}
	if st.ep.byLoad {
		return leastLoaded(cands, req.ClientKey, st.body)
	}
	if id := st.prompt.PreviousResponseID; id != "" {
		// Not a preference but a requirement: an engine keeps the
		// responses it stored to itself, and any other answers 404. So the
		// load bounds do not apply; when the replica is gone (or this
		// router never saw the response) the request is routed as usual.
		if rep, ok := p.responses.get(id); ok {
			if i := slices.IndexFunc(cands, func(c route.Candidate) bool { return c.ID() == rep }); i >= 0 {
				return route.Decision{Index: i, Reason: ReasonPreviousResponse}
			}
		}
	}
	return p.guardedPick(p.cfg.Policy.Pick, req, cands)
}

// guardedPick is the policy's decision (pick), guarded: a policy that
// panics or returns no candidate (a bug, such as an index of -1) costs the
// request its cache-aware placement, not its answer. The request
// goes to the least loaded candidate instead, and the fault is logged
// with its stack at most a few times a second.
func (p *Proxy) guardedPick(pick func(route.Request, []route.Candidate) route.Decision, req route.Request, cands []route.Candidate) (d route.Decision) {
	defer func() {
		v := recover()
		if v == nil && d.Index >= 0 && d.Index < len(cands) {
			return
		}
		fault := fmt.Sprintf("index %d of %d candidates", d.Index, len(cands))
		if v != nil {
			fault = fmt.Sprintf("panic: %v\n%s", v, debug.Stack())
		}
		p.junk.Printf("routing policy failed, placing the request by load instead: %s", fault)
		d = leastLoaded(cands, req.ClientKey, nil)
		d.Reason = ReasonPolicyFault
	}()
	return pick(req, cands)
}

// leastLoaded places a request by load alone (byLoadOrder): an endpoint
// whose replicas keep no prompt cache, or a request whose policy failed.
// Ties are broken by rendezvous hashing on the client key, or on the
// body, so that equal replicas share the load without a shared counter.
func leastLoaded(cands []route.Candidate, clientKey uint64, body []byte) route.Decision {
	key := clientKey
	if key == 0 {
		key = xxh3.Hash(body)
	}
	return route.Decision{Index: pickByLoad(cands, key), Reason: ReasonLoad}
}

// byLoadOrder is the one order of the placements by load (leastLoaded,
// decodePick): negative when a goes before b. The nearest tier first (a
// request's bytes, or a decode leg's KV, cross the network once more per
// tier), then a fresh candidate over a stale one (whose load is unknown,
// so its counts would flatter it), then the fewest requests in flight,
// then the fewest the engine queues, then a replica this router owns (no
// hop), then the greater rendezvous weight (wa, wb) among equals.
func byLoadOrder(a, b *route.Candidate, wa, wb uint64) int {
	if c := cmp.Compare(a.Tier, b.Tier); c != 0 {
		return c
	}
	if a.Stale != b.Stale {
		if b.Stale {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(a.InFlight, b.InFlight); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Waiting, b.Waiting); c != 0 {
		return c
	}
	if la, lb := local(a), local(b); la != lb {
		if la {
			return -1
		}
		return 1
	}
	return cmp.Compare(wb, wa)
}

// pickByLoad returns the index of the first of cands in byLoadOrder,
// with rendezvous weights on key (-1 when there is none).
func pickByLoad(cands []route.Candidate, key uint64) int {
	best := -1
	var bestW uint64
	for i := range cands {
		w := mix64(route.HashID(cands[i].ID()) ^ key)
		if best < 0 || byLoadOrder(&cands[i], &cands[best], w, bestW) < 0 {
			best, bestW = i, w
		}
	}
	return best
}

func local(c *route.Candidate) bool { return c.Detail != nil && c.Detail.Local }

// mix64 is splitmix64's finaliser: rendezvous weights must not be
// correlated across replicas for one key.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// placeLogLen is how many of its latest placements a router remembers
// for decisions that ran alongside them: more decisions than this at one
// router between one decision's view and its commit are caught up only in
// part (the older ones are then counted in the view anyway, being that
// old).
const placeLogLen = 256

// placeBook makes one router's decisions serializable without holding a
// lock while they are computed. A decision reads the loads (View,
// loadBook, hop.Book) and then books its request there (View.Begin,
// hop.Book.send); two requests decided at once on one view both saw the
// same replica idle, and both went there (three cold turns of a burst on
// one replica of four slots). Each decision notes the
// placement sequence its view of the loads reflects (read); its commit,
// under the lock, adds to its candidates the placements committed since,
// and decides again when one of them went to the replica it chose. Only
// a decision that collided pays a second Pick, and only its Pick is
// serialized. It is safe for concurrent use.
//
// The sequence a view reflects is exact only if no commit booked while
// the loads were read: a commit that lands between the loads and the
// sequence is in neither (read after the loads, the sequence counts it;
// the loads do not), and one that lands between the sequence and the
// loads is in both (read before them). So gen is a sequence lock around
// each commit's booking (odd while a commit books and records), and read
// reads the loads again when it moved, a bounded number of times.
type placeBook struct {
	mu  sync.Mutex
	seq atomic.Uint64 // placements committed; written under mu
	gen atomic.Uint64 // odd while a commit books; +2 per commit; written under mu
	log [placeLogLen]placement
	// written is, per replica ID, the prefill blocks of this router's
	// own placements in log (route.Detail.Written): what it wrote into
	// each replica's cache over its last placeLogLen placements, a
	// window of decisions rather than of time, so that it means the same
	// at any request rate. Under mu.
	written map[string]float64
}

// placeReadTries bounds how often read reads the loads: a commit books in
// about a microsecond, so three reads overlap one only under a stream of
// commits, where the last read's sequence stands (a placement that
// overlapped it may then be missed).
const placeReadTries = 3

// read calls loads, which reads the decision's view of the loads, until
// no commit booked while it ran (at most placeReadTries times), and
// returns the placement sequence that view reflects.
func (b *placeBook) read(loads func()) uint64 {
	for try := 1; ; try++ {
		g, s := b.gen.Load(), b.seq.Load()
		loads()
		if g%2 == 0 && b.gen.Load() == g {
			return s // no commit began or ended meanwhile: exact
		}
		if try == placeReadTries {
			return b.seq.Load()
		}
	}
}

// placement is one committed placement: a request booked at a replica,
// decided by this router (own) or by another that forwarded it here.
type placement struct {
	seq    uint64
	id     string
	blocks float64
	own    bool
}

// commit books the request of decision d (at st.cands[d.Index]) under
// the lock: it adds to the candidates the placements committed after the
// sequence they reflect (st.snap) (one more
// in flight, their prefill queued, and one more of this router's own
// where it decided them), and when one of them went to the chosen
// replica and redecide is set (not a forwarded hint, which is the
// deciding router's), it decides again (decide). It returns the
// decision and the request's booking, and leaves in st.snap the sequence
// the candidates now reflect (for a retry's commit).
//
// The booking's kind (an owned replica's or a hop's) is the candidate's
// Detail.Local, from the view the decision read: commit asks the mesh
// nothing under the place lock (Locate takes the mesh's lock, which
// gossip holds for writes), and attempt's Locate, which finds the
// owner's address, is the decision's only one. A replica gone since the
// view was read is booked all the same, and attempt, finding it gone,
// ends the booking; one whose owner changed in that instant is booked
// as the view had it, until the request ends (a second Locate would
// leave the same window, between the two).
func (st *reqState) commit(d route.Decision, redecide bool) (route.Decision, booking) {
	p, cands := st.p, st.cands
	b := &p.places
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.catchUpLocked(cands, st.snap, cands[d.Index].ID()) && redecide {
		d = st.decide()
	}
	c := &cands[d.Index]
	blocks := float64(len(st.hashes) - d.Match)
	if st.leg == hop.LegDecode {
		blocks = 0 // its prompt arrives as KV (pd.go)
	}
	var bk booking
	bk, st.snap = p.bookLocked(c.ID(), c.Detail != nil && c.Detail.Local, blocks, !st.hop)
	return d, bk
}

// bookLocked books a request at replica id and records the placement,
// within the sequence lock that read checks; it returns the booking and
// the placement's sequence.
func (p *Proxy) bookLocked(id string, local bool, blocks float64, mine bool) (booking, uint64) {
	b := &p.places
	b.gen.Add(1)
	bk := p.book(id, local, blocks, mine)
	seq := b.recordLocked(id, blocks, mine)
	b.gen.Add(1)
	return bk, seq
}

// catchUpLocked adds to cands the placements committed after snap and
// reports whether one of them went to replica chosen.
func (b *placeBook) catchUpLocked(cands []route.Candidate, snap uint64, chosen string) bool {
	seq, hit := b.seq.Load(), false
	for s := max(snap+1, seq-min(seq, placeLogLen-1)); s <= seq; s++ {
		if e := &b.log[s%placeLogLen]; e.seq == s && catchUp(cands, e) && e.id == chosen {
			hit = true
		}
	}
	return hit
}

// recordLocked commits a placement and returns its sequence.
func (b *placeBook) recordLocked(id string, blocks float64, own bool) uint64 {
	seq := b.seq.Load() + 1
	e := &b.log[seq%placeLogLen]
	if e.seq != 0 && e.own { // the placement leaving the window
		b.unwriteLocked(e.id, e.blocks)
	}
	*e = placement{seq: seq, id: id, blocks: blocks, own: own}
	if own && blocks > 0 {
		if b.written == nil {
			b.written = map[string]float64{}
		}
		b.written[id] += blocks
	}
	b.seq.Store(seq)
	return seq
}

// unwriteLocked takes blocks off replica id's written count, dropping a
// count that reaches zero (rounding included: the sums are of whole
// block counts, exact in a float64) so that the map holds only the
// replicas of the window.
func (b *placeBook) unwriteLocked(id string, blocks float64) {
	if blocks <= 0 {
		return
	}
	if n := b.written[id] - blocks; n > 0.5 {
		b.written[id] = n
	} else {
		delete(b.written, id)
	}
}

// fillWritten sets Detail.Written on cands from this router's own
// placements in the window.
func (b *placeBook) fillWritten(cands []route.Candidate) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.written) == 0 {
		return
	}
	for i := range cands {
		if d := cands[i].Detail; d != nil {
			d.Written = b.written[d.ID]
		}
	}
}

// catchUp adds placement e to its candidate in cands (sorted by ID, as
// View.Candidates returns them), if there and not stale (a stale
// candidate's load is unknown, not counted), and reports whether it did.
func catchUp(cands []route.Candidate, e *placement) bool {
	i := sort.Search(len(cands), func(i int) bool { return cands[i].ID() >= e.id })
	if i == len(cands) || cands[i].ID() != e.id || cands[i].Stale {
		return false
	}
	c := &cands[i]
	c.InFlight++
	c.PendingPrefillBlocks += e.blocks
	if e.own {
		c.Detail.Own++
		c.Detail.Written += max(e.blocks, 0)
	}
	return true
}

// booking is a request's accounting at the replica it was sent to: the
// view's in-flight count and queued prefill and the load book's dispatch
// (an owned replica), or the hop book's mark (another router's). end
// ends it, firstByte its prefill (nil in the zero booking); both are
// idempotent.
type booking struct {
	firstByte, done, dispatched func()
	mark                        *hop.Mark // a remote replica's, for move
}

// end ends the request's accounting.
func (bk *booking) end() {
	if bk.dispatched != nil {
		bk.dispatched()
	}
	if bk.done != nil {
		bk.done()
	}
}

// book makes the accounting of a request sent to replica id (owned when
// local) bringing blocks of prefill; mine reports that this router
// decided it.
func (p *Proxy) book(id string, local bool, blocks float64, mine bool) booking {
	if local {
		firstByte, done := p.cfg.View.Begin(id, blocks)
		bk := booking{firstByte: firstByte, done: done, dispatched: p.load.dispatch(id, mine)}
		if p.cfg.ProbeLoad != nil {
			p.cfg.ProbeLoad(id, p.load.running(id))
		}
		return bk
	}
	mark, firstByte, done := p.hops.SendMark(id, blocks)
	return booking{firstByte: firstByte, done: done, mark: mark}
}

// ownCandidates keeps the candidates this router owns (a forwarded request
// never travels further) and finds the hinted replica among them. The
// deciding router saw this router's replicas as they were up to a gossip
// interval ago, and not the other routers' dispatches since; this router
// counts them exactly, so it keeps the hint only while route's rule says
// the replica can still start the request (route.Policy.KeepHint), and
// otherwise decides again among its own replicas. A pinned request (an
// SGLang prefill leg, whose decode leg names its replica) keeps the
// hinted replica alone, or none.
func ownCandidates(pol route.Policy, cands []route.Candidate, hint string, pinned bool) ([]route.Candidate, int) {
	keep := false
	for i := range cands {
		if cands[i].ID() == hint {
			keep = pinned || pol.KeepHint(cands, i)
			break
		}
	}
	if pinned {
		cands = slices.DeleteFunc(cands, func(c route.Candidate) bool { return c.ID() != hint })
	}
	own, hinted := cands[:0], -1
	for _, c := range cands {
		if c.Detail == nil || !c.Detail.Local { // the view's word, as commit books by it: no Locate per candidate
			continue
		}
		if c.ID() == hint && keep {
			hinted = len(own)
		}
		own = append(own, c)
	}
	return own, hinted
}
