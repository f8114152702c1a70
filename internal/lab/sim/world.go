package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvmesh/kvmesh/internal/lab/trace"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/route/hopload"
	"github.com/kvmesh/kvmesh/summary"
)

// job is one request's progress under one policy.
type job struct {
	replica, router int32
	dispatch        float64
	est             float64 // pending prefill blocks the dispatching router predicted
	start           float64 // when its prefill started
	pred, hit       int32   // blocks the recording summary predicted at dispatch; blocks the engine had
	best            int32   // the deciding router's best match (route.Decision.BestMatch), -1 when not decided by route
	prefilled, done bool
}

// replica is one simulated engine.
type replica struct {
	cache    *lru
	queue    []int32 // FIFO of jobs waiting to prefill
	qhead    int
	busy     bool    // a prefill is running
	cur      int32   // the job being prefilled
	curStart float64 // when it started
	curEnd   float64 // when it ends
	running  int     // sequences prefilling or decoding
	runJobs  []int32 // the jobs running (for the oldest one's start)
	inFlight int     // dispatched and not finished
	pending  float64
	computed int64 // prefill tokens computed
	// activeBlocks sums the blocks of the requests dispatched here and not
	// finished (Dynamo's active blocks); runningBlocks those of the
	// sequences running, prefilling or decoding (the KV blocks in use, as
	// vllm:kv_cache_usage_perc counts them).
	activeBlocks, runningBlocks int
}

// loadSnap is a replica's load as its owner told it.
type loadSnap struct {
	t        float64
	inFlight int
	pending  float64
	eng      engSnap
	valid    bool
}

// engSnap is what a router knows of a replica's engine: its running and
// waiting counts at the last scrape (vLLM semantics: a request the engine
// admitted counts as running while it prefills), its sequence slots
// (published or learned) and the mean time a request holds it, as the
// owner measured on its own requests.
type engSnap struct {
	running, waiting, slots int
	minSlots                uint8 // while slots is unknown: most seen running with nothing waiting
	seqMs                   float64
	oldest                  float64 // start of the oldest running sequence, if any
	hasOldest               bool
}

// router is one simulated kvmesh router's knowledge.
type router struct {
	copies    []*summary.Summary // per replica; the owner's own summary for owned replicas
	told      []loadSnap         // per replica, from its owner's gossip
	lastHeard []float64          // per router: last message delivered from it
	own       [][]int32          // per replica: own dispatches not yet finished
	written   writtenBook        // its own placements' prefill blocks per replica (route.Detail.Written)
}

// message is one owner's gossip about one replica: a summary delta (or a
// full copy) and the replica's load, sent at t.
type message struct {
	from    int32
	replica int32
	t       float64
	epoch   uint64
	fromV   uint64
	hashes  []uint64
	full    []byte
	load    loadSnap
	// loadOnly: a load beacon (loadTick), which carries the owner's
	// in-flight count and queued prefill and nothing of the engine's
	// counts or the summary.
	loadOnly bool
	pending  int // deliveries outstanding; the message is dropped at zero
}

// exactMatcher answers prefix matches from a replica's real cache; ids
// is the request being routed.
type exactMatcher struct {
	cache *lru
	ids   []int64
}

func (o *exactMatcher) Match([]summary.Probe) int { return o.cache.leadingRun(o.ids) }

// world is one policy's simulation.
type world struct {
	p       *prepared
	policy  string
	routers []*router // nil for policies without summaries
	nR      int       // routers receiving requests
	gossip  bool
	cut     bool // the partition window applies
	rep     []*replica
	jobs    []job
	q       queue
	now     float64
	msgs    []*message
	free    []int32
	lastTx  []uint64 // per replica: owner's summary version at the last send
	// beaconAt and beaconDue are, per owner, when its last load beacon
	// went and whether one is scheduled (loadChanged); nil without
	// beacons.
	beaconAt  []float64
	beaconDue []bool
	cands     []route.Candidate
	ownCands  []route.Candidate
	heat      []map[uint64]int        // per router: its in-flight requests by route's HeatKey
	stems     []map[uint64]route.Stem // per router: the last request it decided of each heat key, as it ended
	exact     []exactMatcher
	scraped   []engSnap            // per replica: engine counts at the last scrape
	slotEst   []route.SlotEstimate // per replica: the owner's learned slots
	ranFree   []int                // per replica: the most sequences the owner saw running with nothing waiting
	probeAt   []float64            // per replica: when the owner last probed or will probe its slots (probeSlots)
	seqMs     []float64            // per replica: the owner's mean request residence, ms
	slotT     []route.SlotTimes    // per replica: the owner's learned slot times
	epochs    []uint64
	peer      *peerState // the peer-router models' learned state

	hitBlocks, blocks, hitTokens, tokens int64
	ttft                                 []float64
	queueMs                              float64
	reasons                              map[string]int
	fullCopies                           int
	belowBest                            int
	warm, found                          int       // retrace: warm requests, and those sent to a best holder
	runs, runsSorted                     []int     // retrace scratch
	ages                                 []float64 // ownerEng scratch
	givenUp                              int64
	admit                                *admission   // nil: requests are routed on arrival
	late                                 *lateBinding // nil: requests wait in the engines' queues
	inFlight, maxQueued                  int          // requests in flight; the most ever beyond the engines' slots
	corrections                          int          // misses the feedback loop corrected
	view                                 viewError
	cuts                                 [3]int // by summary.Cut
}

func runPolicy(ctx context.Context, p *prepared, name string) (PolicyReport, error) {
	cfg := p.cfg
	w := &world{p: p, policy: name, nR: 1, jobs: make([]job, len(p.reqs)),
		ttft: make([]float64, 0, len(p.reqs)), reasons: map[string]int{}}
	w.rep = make([]*replica, cfg.Replicas)
	for j := range w.rep {
		w.rep[j] = &replica{cache: newLRU(p.cacheBlocks)}
	}
	w.cands = make([]route.Candidate, cfg.Replicas)
	details := make([]route.Detail, cfg.Replicas)
	for j := range w.cands {
		details[j].ID = p.ids[j]
		w.cands[j] = route.Candidate{Detail: &details[j], Hash: p.idHashes[j], BlockMs: p.blockMs}
	}
	switch name {
	case PolicyIsolated, PolicyMesh, PolicyPartitioned, PolicySGLang, PolicySMGMesh, PolicyLLMD3:
		w.nR = cfg.Routers
	}
	w.gossip = name == PolicyMesh || name == PolicyPartitioned
	w.cut = name == PolicyPartitioned
	switch name {
	case PolicySingle, PolicyIsolated, PolicyMesh, PolicyPartitioned:
		if err := w.makeRouters(); err != nil {
			return PolicyReport{}, err
		}
	case PolicyExactView, PolicyPooled:
		if name == PolicyPooled {
			pool := newLRU(p.cacheBlocks * cfg.Replicas)
			for _, r := range w.rep {
				r.cache = pool
			}
		}
		w.exact = make([]exactMatcher, cfg.Replicas)
		for j := range w.exact {
			w.exact[j].cache = w.rep[j].cache
		}
	case PolicySGLang, PolicySMGMesh, PolicyDynamo, PolicyLLMD, PolicyLLMD3, PolicyProductionStack:
		w.makePeer()
		if w.smgSynced() {
			w.q.push(p.reqs[0].arrival+ms(cfg.SMGSyncInterval.Seconds()), evSMGSync, 0, 0)
		}
	}
	switch name {
	case PolicySingle, PolicyMesh, PolicyPartitioned, PolicyExactView, PolicyPooled:
		w.scraped = make([]engSnap, cfg.Replicas)
		w.slotEst = make([]route.SlotEstimate, cfg.Replicas)
		w.ranFree = make([]int, cfg.Replicas)
		w.probeAt = make([]float64, cfg.Replicas)
		w.seqMs = make([]float64, cfg.Replicas)
		w.slotT = make([]route.SlotTimes, cfg.Replicas)
		w.q.push(p.reqs[0].arrival, evScrape, 0, 0)
	}
	if w.routers != nil || w.exact != nil {
		w.heat = make([]map[uint64]int, w.nR)
		w.stems = make([]map[uint64]route.Stem, w.nR)
		for k := range w.heat {
			w.heat[k] = map[uint64]int{}
			w.stems[k] = map[uint64]route.Stem{}
		}
	}
	if w.gossip {
		w.lastTx = make([]uint64, cfg.Replicas)
		w.q.push(p.reqs[0].arrival+ms(cfg.GossipInterval.Seconds()), evGossipTick, 0, 0)
		if cfg.LoadInterval > 0 {
			w.beaconAt, w.beaconDue = make([]float64, w.nR), make([]bool, w.nR)
			for o := range w.beaconAt {
				w.beaconAt[o] = math.Inf(-1)
			}
		}
	}

	switch name {
	case PolicySingle, PolicyIsolated, PolicyMesh, PolicyPartitioned, PolicyExactView, PolicyPooled:
		if cfg.AdmitMaxWaiting > 0 {
			w.admit = newAdmission(w, cfg.AdmitMaxWaiting)
		}
		if cfg.LateBind && w.routers != nil || cfg.LateBind && w.exact != nil {
			w.late = newLateBinding(w)
		}
	}
	next := 0
	for steps := 0; next < len(p.reqs) || !w.q.empty(); steps++ {
		if steps&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return PolicyReport{}, fmt.Errorf("sim %s: %w", name, err)
			}
		}
		// Arrivals go before events at the same instant.
		if next < len(p.reqs) && (w.q.empty() || p.reqs[next].arrival <= w.q.peek()) {
			w.now = p.reqs[next].arrival
			k, i := next%w.nR, int32(next)
			if w.admit != nil && w.admit.hold(k, i) {
				next++
				continue
			}
			if err := w.arrive(k, i); err != nil {
				return PolicyReport{}, err
			}
			next++
			continue
		}
		e := w.q.pop()
		w.now = e.t
		var err error
		switch e.kind {
		case evPrefillDone:
			w.prefillDone(e.a)
		case evDecodeDone:
			err = w.decodeDone(e.a, e.b)
		case evGossipTick:
			w.tick(next < len(p.reqs) || w.admit.waiting())
		case evLoadTick:
			loadTick(w, int(e.a))
		case evScrape:
			w.scrape(next < len(p.reqs) || w.admit.waiting())
		case evProbe:
			scrapeOne(w, int(e.a))
		case evSMGSync:
			w.smgSync(next < len(p.reqs))
		case evDeliver:
			err = w.deliver(e.a, e.b)
		case evAdmitPoll:
			w.admit.polling[e.a] = false
			err = w.admit.next(int(e.a))
		}
		if err != nil {
			return PolicyReport{}, fmt.Errorf("sim %s at %.0f ms: %w", name, w.now, err)
		}
	}
	return w.report(), nil
}

func (w *world) makeRouters() error {
	cfg := w.p.cfg
	w.epochs = make([]uint64, cfg.Replicas)
	for j := range w.epochs {
		w.epochs[j] = splitmix64(cfg.Seed ^ uint64(j+1)<<32)
	}
	w.routers = make([]*router, w.nR)
	for k := range w.routers {
		r := &router{copies: make([]*summary.Summary, cfg.Replicas), told: make([]loadSnap, cfg.Replicas),
			lastHeard: make([]float64, w.nR), own: make([][]int32, cfg.Replicas), written: newWrittenBook(cfg.Replicas)}
		for j := range r.copies {
			s, err := summary.New(w.p.params(), w.epochs[j])
			if err != nil {
				return fmt.Errorf("sim: %w", err)
			}
			r.copies[j] = s
		}
		for o := range r.lastHeard {
			r.lastHeard[o] = w.p.reqs[0].arrival
		}
		w.routers[k] = r
	}
	return nil
}

func (w *world) owner(j int) int { return j % w.nR }

// partitioned reports whether gossip between routers a and b is cut at t.
func (w *world) partitioned(a, b int, t float64) bool {
	if !w.cut || t < w.p.partStart || t >= w.p.partEnd {
		return false
	}
	half := w.nR / 2
	return (a < half) != (b < half)
}

// arrive routes request i at its entry router k and dispatches it.
func (w *world) arrive(k int, i int32) error {
	r := &w.p.reqs[i]
	var j int
	best := int32(-1)
	est := float64(len(r.ids))
	switch w.policy {
	case PolicyRoundRobin:
		j = int(i) % len(w.rep)
	case PolicyLeastLoaded:
		j = w.leastLoaded(int(i))
	case PolicyConsistentHash:
		j = w.consistentHash(r)
	case PolicySGLang, PolicySMGMesh, PolicyDynamo, PolicyLLMD, PolicyLLMD3, PolicyProductionStack:
		j = w.peerArrive(k, i)
	default:
		w.fillCandidates(k, r)
		if w.gossip {
			w.view.add(k, w)
		}
		req := r.req
		if w.heat != nil {
			hk := w.p.cfg.Route.HeatKey(req)
			w.heat[k][hk]++
			req.Concurrent = w.heat[k][hk]
			req.ForkBlocks = w.stems[k][hk].Fork(req)
		}
		d := w.p.cfg.Route.Pick(req, w.cands)
		if d.Index < 0 {
			return errors.New("route picked no replica")
		}
		j = d.Index
		if w.routers != nil {
			// The deciding router books its own placement at the replica it
			// chose, with the blocks it predicted the replica lacks, as the
			// proxy's place book does at commit (before the owner may
			// decide again: the entry learns of that only as the request's
			// mark moves, which Written does not follow).
			w.routers[k].written.place(j, float64(len(r.ids)-d.Match), true)
		}
		if o := w.owner(j); w.gossip && o != k {
			// The request travels through the replica's owner, which
			// checks the hint with its exact view and decides again among
			// its own replicas if it does not keep it (proxy/request.go).
			w.fillCandidates(o, r)
			// The owner commits the forwarded request too: a placement of
			// its window that is not its own (no blocks written by it).
			w.routers[o].written.place(j, 0, false)
			if !w.p.cfg.Route.KeepHint(w.cands, j) {
				own := w.ownCands[:0]
				for jj := o; jj < len(w.cands); jj += w.nR {
					own = append(own, w.cands[jj])
				}
				w.ownCands = own
				d2 := w.p.cfg.Route.Pick(req, own)
				j = o + d2.Index*w.nR
				d.Match = d2.Match
				w.reasons["rehint"]++
			}
		}
		est = float64(len(r.ids) - d.Match)
		best = int32(d.BestMatch)
		w.reasons[string(d.Reason)]++
		if d.Match < d.BestMatch {
			w.belowBest++
			w.givenUp += int64(d.BestMatch - d.Match)
		}
	}
	if w.late != nil && w.late.pools(w.owner(j)) && w.late.full(j) {
		w.late.hold(lateHeld{i: i, entry: int32(k), j: int32(j), est: est, best: best})
		return nil
	}
	w.retrace(j, r)
	w.dispatch(k, j, i, est)
	w.jobs[i].best = best
	return nil
}

// retrace counts, for a request that some replica holds more of than half
// of the replicas do (by their real caches: a conversation's next turn, a
// hot prompt), whether it went to a replica holding the most of it: how
// well the policy finds the replica a conversation lives on.
func (w *world) retrace(j int, r *simReq) {
	runs := w.runs[:0]
	best := 0
	for _, rep := range w.rep {
		m := rep.cache.leadingRun(r.ids)
		runs = append(runs, m)
		best = max(best, m)
	}
	w.runs = runs
	sorted := append(w.runsSorted[:0], runs...)
	slices.Sort(sorted)
	w.runsSorted = sorted
	common := sorted[(len(sorted)-1)/2] // held by at least half
	if best <= common {
		return
	}
	w.warm++
	if runs[j] == best {
		w.found++
	}
}

// consistentHash is the classic baseline, independent of kvmesh's rule:
// rendezvous hashing of the prompt's first two blocks (1,024 tokens) with
// bounded loads on exact in-flight counts (Mirrokni et al.; c = 1.25, as
// HAProxy's hash-balance-factor and SMG's prefix hash use): the first
// replica in the key's order with in-flight + 1 <= ceil(c × (total+1) / R).
func (w *world) consistentHash(r *simReq) int {
	key := r.req.Hashes[min(len(r.req.Hashes)-1, 1)]
	total := 0
	for _, rep := range w.rep {
		total += rep.inFlight
	}
	bound := int(math.Ceil(1.25 * float64(total+1) / float64(len(w.rep))))
	best, bestW := -1, uint64(0)
	for j, rep := range w.rep {
		if rep.inFlight+1 > bound {
			continue
		}
		if wt := splitmix64(key ^ w.p.idHashes[j]); best < 0 || wt > bestW {
			best, bestW = j, wt
		}
	}
	return best // someone is at or below the mean, so under the bound
}

func (w *world) leastLoaded(i int) int {
	best := -1
	n := len(w.rep)
	for o := 0; o < n; o++ {
		j := (i + o) % n // rotate ties so no replica is favoured
		if best < 0 || w.rep[j].inFlight < w.rep[best].inFlight {
			best = j
		}
	}
	return best
}

// fillCandidates writes router k's view of every replica into w.cands.
func (w *world) fillCandidates(k int, r *simReq) {
	stale := ms(w.p.cfg.StaleAfter.Seconds())
	for j := range w.cands {
		c := &w.cands[j]
		c.Summary, c.Stale = nil, false
		rep := w.rep[j]
		var eng engSnap
		var inFlight, own int
		var pending float64
		local := false
		switch w.policy {
		case PolicyExactView, PolicyPooled:
			// One view of everything: every request in flight is as
			// known as the router's own.
			w.exact[j].ids = r.ids
			c.Summary = &w.exact[j]
			inFlight, pending = rep.inFlight, w.pendingNow(rep)
			own, local = inFlight, true
			eng = w.ownerEng(j)
		case PolicySingle:
			c.Summary = w.routers[0].copies[j]
			inFlight, pending = rep.inFlight, w.pendingNow(rep)
			own, local = inFlight, true
			eng = w.ownerEng(j)
		case PolicyIsolated:
			c.Summary = w.routers[k].copies[j]
			inFlight, pending, own = w.ownLoad(k, j, nil)
		default: // mesh, partitioned
			rt := w.routers[k]
			o := w.owner(j)
			switch {
			case o == k:
				c.Summary = rt.copies[j]
				inFlight, pending = rep.inFlight, w.pendingNow(rep)
				_, _, own = w.ownLoad(k, j, nil)
				local = true
				eng = w.ownerEng(j)
			case w.now-rt.lastHeard[o] > stale:
				c.Stale = true
				inFlight, pending, own = w.ownLoad(k, j, nil)
			default:
				c.Summary = rt.copies[j]
				inFlight, pending, own = w.ownLoad(k, j, &rt.told[j])
				eng = rt.told[j].eng
				// Only the owner knows when the requests at its replicas
				// began (the mesh does not gossip it), as in the proxy.
				eng.hasOldest = false
			}
		}
		c.InFlight, c.PendingPrefillBlocks = route.Count32(inFlight), pending
		c.Running, c.Waiting, c.Slots = route.Count32(eng.running), route.Count32(eng.waiting), route.Count32(eng.slots)
		c.MinSlots = eng.minSlots
		c.HasLoad = true // every simulated engine publishes its counts
		c.Detail.SeqMs = eng.seqMs
		c.Detail.Own, c.Detail.Local = route.Count32(own), local
		c.Detail.SlotAgeMs, c.Detail.FreeMs = 0, 0
		c.Held, c.Detail.Written = 0, 0
		switch w.policy {
		case PolicyExactView, PolicyPooled:
			c.Held = route.Count32(rep.cache.count)
		case PolicySingle:
			c.Held = route.Count32(w.routers[0].copies[j].Held())
			c.Detail.Written = w.routers[0].written.blocks[j]
		default: // isolated, mesh, partitioned: this router's copy, as the mesh's view reads it (stale or not)
			c.Held = route.Count32(w.routers[k].copies[j].Held())
			c.Detail.Written = w.routers[k].written.blocks[j]
		}
		if eng.hasOldest {
			c.Detail.SlotAgeMs = max(w.now-eng.oldest, 1e-3)
		}
	}
	route.PoolSlots(w.cands) // as the mesh's view does (mesh/view.go)
	// The owner asks when a running request ends only of a replica the
	// decision finds full, pooled slots included: after the view, as
	// proxy/load.go's fill follows the mesh's candidates.
	for j := range w.cands {
		c := &w.cands[j]
		if c.Detail.Local && c.Detail.SlotAgeMs > 0 && full(c) {
			c.Detail.FreeMs = w.slotT[j].FreeMs(w.runAges(j))
		}
	}
}

// full reports that the decision would ask c's slot wait (proxy/load.go's
// full): its slots known to be taken, or with unknown slots the engine
// queueing.
func full(c *route.Candidate) bool {
	if c.Slots > 0 {
		return c.InFlight >= c.Slots
	}
	return c.Waiting > 0
}

// runAges is how long each request running at replica j has run, in
// w.ages (reused).
func (w *world) runAges(j int) []float64 {
	ages := w.ages[:0]
	for _, i := range w.rep[j].runJobs {
		ages = append(ages, w.now-w.jobs[i].start)
	}
	w.ages = ages
	return ages
}

// ownLoad is router k's estimate of replica j's load: what the owner told
// it (if anything) plus its own dispatches since that snapshot, or its own
// unfinished dispatches alone when it was told nothing (hopload.Add, the
// proxy's rule); and how many of its own dispatches there are unfinished
// (route.Detail.Own).
func (w *world) ownLoad(k, j int, told *loadSnap) (inFlight int, pending float64, mine int) {
	rt := w.routers[k]
	var load hopload.Load
	since := hopload.Millis(-1)
	if told != nil && told.valid {
		load, since = hopload.Load{InFlight: told.inFlight, Pending: told.pending}, hopload.Millis(told.t)
	}
	own := rt.own[j][:0]
	for _, ji := range rt.own[j] {
		if !w.jobs[ji].done {
			own = append(own, ji)
		}
	}
	clear(rt.own[j][len(own):])
	rt.own[j] = own
	load = hopload.Add(load, since, own, w.sentOf)
	return load.InFlight, load.Pending, len(own)
}

// sentOf is job ji as hopload counts it.
func (w *world) sentOf(ji int32) hopload.Sent[hopload.Millis] {
	jb := &w.jobs[ji]
	return hopload.Sent[hopload.Millis]{At: hopload.Millis(jb.dispatch), Blocks: jb.est, Prefilled: jb.prefilled}
}

// dispatch sends request i from router k to replica j, records it in the
// summary its owner keeps, and queues it at the replica.
func (w *world) dispatch(k, j int, i int32, est float64) {
	r := &w.p.reqs[i]
	w.jobs[i] = job{replica: int32(j), router: int32(k), dispatch: w.now, est: est}
	rep := w.rep[j]
	rep.inFlight++
	rep.pending += est
	loadChanged(w, j)
	rep.activeBlocks += len(r.ids)
	if s := w.recorder(k, j); s != nil {
		w.jobs[i].pred = int32(s.Match(r.req.Probes))
		s.Add(r.req.Hashes)
	}
	switch w.policy {
	case PolicyIsolated, PolicyMesh, PolicyPartitioned:
		w.routers[k].own[j] = append(w.routers[k].own[j], i)
	}
	rep.queue = append(rep.queue, i)
	w.tryStart(j)
	w.inFlight++
	if w.slotEst != nil {
		probeSlots(w, j)
	}
	w.maxQueued = max(w.maxQueued, w.inFlight-len(w.rep)*w.p.cfg.MaxNumSeqs)
}

// tryStart begins the next prefill at replica j if the GPU is free and a
// sequence slot is open.
func (w *world) tryStart(j int) {
	rep := w.rep[j]
	if rep.busy || rep.running >= w.p.cfg.MaxNumSeqs || rep.qhead == len(rep.queue) {
		return
	}
	i := rep.queue[rep.qhead]
	rep.qhead++
	if rep.qhead == len(rep.queue) {
		rep.queue, rep.qhead = rep.queue[:0], 0
	} else if rep.qhead > 1024 && rep.qhead*2 > len(rep.queue) {
		rep.queue = append(rep.queue[:0], rep.queue[rep.qhead:]...)
		rep.qhead = 0
	}
	r := &w.p.reqs[i]
	hit := rep.cache.leadingRun(r.ids)
	w.jobs[i].hit = int32(hit)
	dur, computed := w.p.prefillMs(r, hit)
	w.hitBlocks += int64(hit)
	w.blocks += int64(len(r.ids))
	w.hitTokens += int64(min(r.input, hit*trace.MooncakeBlockTokens))
	w.tokens += int64(r.input)
	rep.computed += int64(computed)
	w.queueMs += w.now - r.arrival
	w.ttft = append(w.ttft, w.now+dur-r.arrival)
	rep.busy, rep.cur, rep.curStart, rep.curEnd = true, i, w.now, w.now+dur
	w.jobs[i].start = w.now
	rep.running++
	rep.runJobs = append(rep.runJobs, i)
	rep.runningBlocks += len(r.ids)
	w.q.push(w.now+dur, evPrefillDone, int32(j), 0)
}

// pendingNow is the prefill work queued at a replica as its owner knows
// it: the estimates of the requests not yet prefilled, less the part of the
// running prefill already done.
func (w *world) pendingNow(rep *replica) float64 {
	p := rep.pending
	if rep.busy && rep.curEnd > rep.curStart {
		p -= w.jobs[rep.cur].est * (w.now - rep.curStart) / (rep.curEnd - rep.curStart)
	}
	return max(p, 0)
}

func (w *world) prefillDone(j int32) {
	rep := w.rep[j]
	i := rep.cur
	r := &w.p.reqs[i]
	rep.cache.touchAll(r.ids)
	jb := &w.jobs[i]
	jb.prefilled = true
	rep.pending -= jb.est
	loadChanged(w, int(j))
	rep.busy = false
	w.q.push(w.now+float64(r.output)*w.p.cfg.DecodeMsPerToken, evDecodeDone, j, i)
	w.tryStart(int(j))
}

func (w *world) decodeDone(j, i int32) error {
	rep := w.rep[j]
	rep.running--
	if k := slices.Index(rep.runJobs, i); k >= 0 {
		rep.runJobs[k] = rep.runJobs[len(rep.runJobs)-1]
		rep.runJobs = rep.runJobs[:len(rep.runJobs)-1]
	}
	rep.inFlight--
	loadChanged(w, int(j))
	w.inFlight--
	n := len(w.p.reqs[i].ids)
	rep.activeBlocks -= n
	rep.runningBlocks -= n
	w.jobs[i].done = true
	w.learn(int(j), i)
	if w.heat != nil {
		m := w.heat[w.jobs[i].router]
		hk := w.p.cfg.Route.HeatKey(w.p.reqs[i].req)
		if m[hk]--; m[hk] <= 0 {
			delete(m, hk)
		}
		if b := w.jobs[i].best; b >= 0 {
			// The router records the stem when the request ends, as the
			// proxy does (proxy/load.go, on the finished attempt).
			st := w.stems[w.jobs[i].router]
			st[hk] = route.StemOf(w.p.reqs[i].req, int(b))
		}
	}
	if w.seqMs != nil {
		// The owner's running mean of how long a request holds a
		// sequence slot, prefill to last token (a proxy times it as first
		// token to last plus the prefill it estimated).
		d := w.now - w.jobs[i].start
		w.slotT[j].Observe(d)
		if w.seqMs[j] == 0 {
			w.seqMs[j] = d
		} else {
			w.seqMs[j] += (d - w.seqMs[j]) / 16
		}
	}
	if w.peer != nil {
		w.peer.peerDone(int(w.jobs[i].router), int(j))
	}
	w.tryStart(int(j))
	if w.late != nil {
		w.late.release(w.owner(int(j)))
	}
	if w.admit != nil {
		// The entry router relays the end, which wakes its dispatcher.
		return w.admit.next(int(w.jobs[i].router))
	}
	return nil
}

// tick sends, from every owner, each owned replica's summary delta since
// the last tick and its exact load. Ticks stop with the arrivals: after
// the last one no decision reads a view.
func (w *world) tick(more bool) {
	for j := range w.rep {
		o := w.owner(j)
		s := w.routers[o].copies[j]
		m := &message{from: int32(o), replica: int32(j), t: w.now, epoch: s.Epoch(), fromV: w.lastTx[j],
			load: loadSnap{t: w.now, inFlight: w.rep[j].inFlight, pending: w.pendingNow(w.rep[j]), eng: w.ownerEng(j), valid: true}}
		hashes, ok := s.Since(w.lastTx[j])
		if ok {
			m.hashes = hashes
		} else {
			m.full = s.AppendEncode(nil, w.p.fingerprint)
		}
		w.lastTx[j] = s.Version()
		fanOut(w, o, m)
	}
	if more {
		w.q.push(w.now+ms(w.p.cfg.GossipInterval.Seconds()), evGossipTick, 0, 0)
	}
}

// fanOut sends owner o's message m to every other router it is not cut
// off from, GossipDelay later.
func fanOut(w *world, o int, m *message) {
	mi := w.store(m)
	for k := range w.routers {
		if k == o || w.partitioned(o, k, w.now) {
			continue
		}
		m.pending++
		w.q.push(w.now+ms(w.p.cfg.GossipDelay.Seconds()), evDeliver, int32(k), mi)
	}
	if m.pending == 0 {
		w.release(mi)
	}
}

// loadChanged is replica j's load changing (a dispatch, a prefill done,
// a request ended): its owner's beacon loop wakes (mesh/beacon.go) and
// sends at once when its last beacon is a load interval old, else once
// the interval has passed, one send carrying every change since.
func loadChanged(w *world, j int) {
	if w.beaconDue == nil {
		return
	}
	o := w.owner(j)
	if w.beaconDue[o] {
		return
	}
	w.beaconDue[o] = true
	w.q.push(max(w.now, w.beaconAt[o]+ms(w.p.cfg.LoadInterval.Seconds())), evLoadTick, int32(o), 0)
}

// loadTick sends, from owner o, each owned replica's in-flight count and
// queued prefill alone, as the router's load beacons do between the
// summary ticks: a router that decides on another owner's replica sees
// the requests the other routers sent there within about a load
// interval, not a gossip interval. A beacon updates only a load the
// summary ticks already told (the router applies one only to a replica
// whose owner's state it holds).
func loadTick(w *world, o int) {
	w.beaconDue[o], w.beaconAt[o] = false, w.now
	for j := o; j < len(w.rep); j += w.nR {
		m := &message{from: int32(o), replica: int32(j), t: w.now, loadOnly: true,
			load: loadSnap{t: w.now, inFlight: w.rep[j].inFlight, pending: w.pendingNow(w.rep[j]), valid: true}}
		fanOut(w, o, m)
	}
}

// scrape reads every replica's engine counts, as an owner scrapes
// /metrics, and learns its slots when the engine does not publish them
// (and until it has queued, the most it was seen running with nothing
// waiting, as proxy/health does).
// Scrapes stop with the arrivals.
func (w *world) scrape(more bool) {
	for j := range w.rep {
		scrapeOne(w, j)
	}
	if more {
		w.q.push(w.now+ms(w.p.cfg.ScrapeInterval.Seconds()), evScrape, 0, 0)
	}
}

// scrapeOne reads replica j's engine counts.
func scrapeOne(w *world, j int) {
	cfg := w.p.cfg
	rep := w.rep[j]
	in := rep.running + len(rep.queue) - rep.qhead
	run, wait := min(in, cfg.MaxNumSeqs), max(0, in-cfg.MaxNumSeqs)
	slots := cfg.MaxNumSeqs
	if !cfg.SlotsPublished {
		w.slotEst[j] = w.slotEst[j].Observe(run, wait)
		slots = w.slotEst[j].Slots
	}
	if wait == 0 {
		w.ranFree[j] = max(w.ranFree[j], run)
	}
	var minSlots uint8
	if slots <= 0 {
		minSlots = uint8(min(w.ranFree[j], math.MaxUint8))
	}
	w.scraped[j] = engSnap{running: run, waiting: wait, slots: slots, minSlots: minSlots}
}

// probeSlots has the owner of replica j read its engine's counts soon,
// out of the scrape schedule, when it has just sent the engine more
// requests than it knows it to run (the router's
// health.Checker.ProbeLoad): with slots unknown, more than it was seen
// running with nothing waiting (the moment it may first queue, which is
// when its slots can be learnt, SlotEstimate); with slots learnt, more
// than those while the last scrape showed nothing waiting. One probe is
// pending at most, probeGap after the last.
func probeSlots(w *world, j int) {
	cfg := w.p.cfg
	known := w.ranFree[j]
	if sl := w.slotEst[j].Slots; sl > 0 {
		if w.scraped[j].waiting > 0 {
			return // seen queueing at the count: confirmed
		}
		known = sl // learnt from the queue: a floor the engine may exceed
	}
	if cfg.SlotsPublished || !cfg.ProbeSlots || w.rep[j].inFlight <= known || w.probeAt[j] > w.now {
		return
	}
	w.probeAt[j] = max(w.now+probeDelay, w.probeAt[j]+probeGap)
	w.q.push(w.probeAt[j], evProbe, int32(j), 0)
}

// ownerEng is what replica j's owner knows of its engine now: the last
// scrape and its own running mean of request residence.
func (w *world) ownerEng(j int) engSnap {
	e := w.scraped[j]
	e.seqMs = w.seqMs[j]
	// The owner proxies every request to its replicas, so it knows when
	// each began (proxy/load.go dates it from the dispatch).
	for _, i := range w.rep[j].runJobs {
		if st := w.jobs[i].start; !e.hasOldest || st < e.oldest {
			e.oldest, e.hasOldest = st, true
		}
	}
	return e
}

func (w *world) store(m *message) int32 {
	if n := len(w.free); n > 0 {
		i := w.free[n-1]
		w.free = w.free[:n-1]
		w.msgs[i] = m
		return i
	}
	w.msgs = append(w.msgs, m)
	return int32(len(w.msgs) - 1)
}

func (w *world) release(i int32) {
	w.msgs[i] = nil
	w.free = append(w.free, i)
}

// deliver applies message mi at router k, unless the partition cut it in
// flight. A delta that does not follow the copy is repaired by a full copy
// of the owner's summary.
func (w *world) deliver(k, mi int32) error {
	m := w.msgs[mi]
	m.pending--
	if m.pending == 0 {
		defer w.release(mi)
	}
	if w.partitioned(int(m.from), int(k), w.now) {
		return nil
	}
	rt := w.routers[k]
	j := m.replica
	if m.loadOnly {
		// Not a word on the summary: the copy's staleness is the
		// summary ticks' (lastHeard).
		if t := &rt.told[j]; t.valid && m.load.t >= t.t {
			t.t, t.inFlight, t.pending = m.load.t, m.load.inFlight, m.load.pending
		}
		return nil
	}
	rt.lastHeard[m.from] = w.now
	if m.load.t >= rt.told[j].t {
		rt.told[j] = m.load
	}
	switch {
	case m.full != nil:
		s, err := summary.Decode(m.full, w.p.fingerprint)
		if err != nil {
			return fmt.Errorf("full summary of replica %d: %w", j, err)
		}
		rt.copies[j] = s
		w.fullCopies++
	case len(m.hashes) > 0:
		err := rt.copies[j].Apply(m.epoch, m.fromV, m.hashes)
		if errors.Is(err, summary.ErrGap) || errors.Is(err, summary.ErrDiverged) {
			owner := w.routers[m.from].copies[j]
			s, derr := summary.Decode(owner.AppendEncode(nil, w.p.fingerprint), w.p.fingerprint)
			if derr != nil {
				return fmt.Errorf("repair summary of replica %d: %w", j, derr)
			}
			rt.copies[j] = s
			w.fullCopies++
		} else if err != nil {
			return fmt.Errorf("apply delta of replica %d: %w", j, err)
		}
	}
	return nil
}

func (w *world) report() PolicyReport {
	rep := PolicyReport{Name: w.policy, Requests: len(w.ttft), Reasons: w.reasons, FullCopies: w.fullCopies,
		Corrections: w.corrections, CutsOlder: w.cuts[summary.CutOlder], CutsBoth: w.cuts[summary.CutBoth],
		BelowBestMatch: w.belowBest, GivenUpBlocks: w.givenUp, WarmRequests: w.warm}
	w.view.report(&rep)
	if w.warm > 0 {
		rep.Retrace = float64(w.found) / float64(w.warm)
	}
	if w.blocks > 0 {
		rep.HitRatio = float64(w.hitBlocks) / float64(w.blocks)
	}
	if w.tokens > 0 {
		rep.TokenHitRatio = float64(w.hitTokens) / float64(w.tokens)
	}
	sorted := slices.Clone(w.ttft)
	slices.Sort(sorted)
	rep.TTFTP50Ms = percentile(sorted, 0.50)
	rep.TTFTP90Ms = percentile(sorted, 0.90)
	rep.TTFTP99Ms = percentile(sorted, 0.99)
	for _, v := range w.ttft {
		rep.TTFTMeanMs += v
	}
	if len(w.ttft) > 0 {
		rep.TTFTMeanMs /= float64(len(w.ttft))
	}
	if len(w.ttft) > 0 {
		rep.MeanQueueMs = w.queueMs / float64(len(w.ttft))
		rep.MaxQueued = w.maxQueued
	}
	var sum, mx int64
	for _, r := range w.rep {
		sum += r.computed
		mx = max(mx, r.computed)
	}
	if sum > 0 {
		rep.PrefillMaxOverMean = float64(mx) / (float64(sum) / float64(len(w.rep)))
	}
	return rep
}

// viewError measures how far a deciding router's view of the replicas it
// does not own (the owner's gossiped load plus its own dispatches since)
// is from the engines at the instant of the decision: the lag gossip
// costs. Requests that arrive together at several routers are each placed
// on the same snapshot, blind to the others' dispatches.
type viewError struct {
	views, slotViews      int // non-stale views of replicas not owned; those with known slots
	inFlightErr           int // Σ (view's in-flight − engine's)
	inFlightAbsErr        int // Σ |view's in-flight − engine's|
	falseFree, missedFree int // view shows a free slot the engine lacks; the reverse
}

// add counts router k's view in w.cands, as filled for a decision.
func (v *viewError) add(k int, w *world) {
	for j := range w.cands {
		c := &w.cands[j]
		if w.owner(j) == k || c.Stale {
			continue
		}
		in := w.rep[j].inFlight
		v.views++
		v.inFlightErr += int(c.InFlight) - in
		v.inFlightAbsErr += max(int(c.InFlight)-in, in-int(c.InFlight))
		if c.Slots <= 0 {
			continue
		}
		v.slotViews++
		viewFree, free := c.InFlight < c.Slots, in < w.p.cfg.MaxNumSeqs
		switch {
		case viewFree && !free:
			v.falseFree++
		case !viewFree && free:
			v.missedFree++
		}
	}
}

func (v *viewError) report(p *PolicyReport) {
	if v.views > 0 {
		p.ViewInFlightError = float64(v.inFlightErr) / float64(v.views)
		p.ViewInFlightAbsError = float64(v.inFlightAbsErr) / float64(v.views)
	}
	if v.slotViews > 0 {
		p.ViewFalseFree = float64(v.falseFree) / float64(v.slotViews)
		p.ViewMissedFree = float64(v.missedFree) / float64(v.slotViews)
	}
}

// writtenLog is how many placements a router's written counts cover: the
// proxy's place book (proxy/place.go, placeLogLen).
const writtenLog = 256

// writtenBook is one router's record of its last writtenLog placements
// (its own decisions and the requests other routers forwarded to it) and,
// per replica, the prefill blocks its own placements there predicted the
// replica lacked: route.Detail.Written, as the proxy's place book keeps
// it.
type writtenBook struct {
	blocks []float64 // per replica
	ring   [writtenLog]writtenEntry
	n      int // placements recorded
}

type writtenEntry struct {
	replica int32
	blocks  float64
	own     bool
}

func newWrittenBook(replicas int) writtenBook {
	return writtenBook{blocks: make([]float64, replicas)}
}

// place records a placement at replica j; blocks count only when own.
func (b *writtenBook) place(j int, blocks float64, own bool) {
	e := &b.ring[b.n%writtenLog]
	if b.n >= writtenLog && e.own {
		b.blocks[e.replica] = max(0, b.blocks[e.replica]-e.blocks)
	}
	blocks = max(blocks, 0)
	*e = writtenEntry{replica: int32(j), blocks: blocks, own: own}
	if own {
		b.blocks[j] += blocks
	}
	b.n++
}

// probeGap is the least time between two slot probes of one replica, and
// probeDelay the time a probe's /metrics read takes.
const (
	probeGap   = 100.0 // ms
	probeDelay = 5.0   // ms
)
