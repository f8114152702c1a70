// Package route makes kvmesh's routing decision: which replica should serve
// a request, given what the deciding router knows of every replica's cache
// and load. It is pure: the same request and the same view give the same
// choice on every router, with ties broken by rendezvous hashing, never by
// map order or chance. It imports no network code; the mesh fills in the
// view, the simulator fills in a simulated one.
//
// The decision, in order:
//
//  1. Every candidate with a summary that counts is asked for its prefix
//     match. The common prefix is the longest match that at least half of
//     them (and two) hold (a global system prompt, or a hot prompt); only a
//     match beyond it says anything about where the request should go.
//  2. If no summary counts, or no candidate holds more than the common
//     prefix, the request is cold: it goes by consistent hashing with
//     bounded loads (rendezvous order over the key, the first replica that
//     can start it with queued prefill within LoadFactor times the mean),
//     keyed by the client's routing key or the first KeyBlocks blocks after
//     the common prefix; holders of a long common prefix go first, and
//     when none of them can take it, it is copied only to an idle replica
//     (else it queues at the holder with the shortest wait). With
//     every summary fresh it takes the shortest wait among them; among
//     equal waits, the one of the key's first two choices with fewer
//     requests in flight (fewer arrivals queue behind its prefill). In a
//     burst onto an idle cluster (every engine last reported idle, with
//     counts it publishes: HasLoad) whose key's first choice is busy, it
//     takes the replica with the fewest of this router's own requests
//     (Detail.Own) instead: each
//     router sees the others' part of the burst only at its own replicas,
//     and routers that each spread their own share spread the sum.
//     Requests that will share a prefix share the key, so
//     they land together, and routers that cannot talk still agree.
//  3. Otherwise every candidate is scored by an estimate of time to first
//     token plus the recompute a move costs the cluster: network + prefill
//     queued ahead + wait for a sequence slot (from the engine's running,
//     waiting and slots, with the router's in-flight count as the fast
//     signal, dated by the age of the oldest request in flight where the
//     router knows it) + RecomputeWeight × the prefill of the blocks it lacks. The
//     holder keeps the request while it can start it at once; it moves only
//     when the wait it would impose beats the weighted recompute, and then
//     to the next holder first, and off the holders to a replica this
//     router owns (whose load it sees exactly) before one whose free
//     slot it knows only from gossip. A stem other
//     requests fork from (Request.ForkBlocks: a hot template or document,
//     not a conversation's history) costs only its prefill to copy when
//     its holders are full and at least half the replicas could start
//     it: the copy serves the stem's other requests too. A copy is that
//     cheap only on an idle replica (a free slot, no prefill queued);
//     on a busy one it delays the requests queued there.
//
// The hot-spot guard (consistent hashing with bounded loads, Mirrokni,
// Thorup, Zadimoghaddam 2018, applied to the queue for slots, and to
// in-flight requests when slots are unknown) spills a request from a
// holder that queues far more than the mean, so a hot prefix spreads to a
// second holder instead of collapsing onto one. A holder that can start
// the request at once is never held to it, and a spill never copies the
// prefix onto a busy replica (no free slot, or prefill queued): that only
// moves the queue and adds the copy's prefill to it.
//
// Another router's decision for one of this router's replicas is checked
// with KeepHint against the exact view and taken again among its own
// replicas when the replica can no longer start the request.
package route

import (
	"math"

	"github.com/kvmesh/kvmesh/summary"
	"github.com/zeebo/xxh3"
)

// Matcher tells how many leading blocks of a request a replica probably
// holds. *summary.Summary implements it; the simulator's oracle implements
// it over the replica's real cache.
type Matcher interface {
	Match(probes []summary.Probe) int
}

// Candidate is one replica as the deciding router sees it.
//
// Its layout is the decision's cost: a decision over a thousand replicas
// reads every candidate two or three times, so each byte of the struct is
// a kilobyte per pass. The fields every decision reads of every candidate
// come first and fill 80 bytes (counts as int32, the tier as an int8,
// Stale and HasLoad in what was padding; the times stay float64, as a
// float32 would change costs and so decisions);
// the replica's ID and the slot-timing fields, which only the views and
// the slot wait of a full engine read, are behind the *Detail pointer.
// TestCandidateSize holds the size.
type Candidate struct {
	// Summary answers prefix matches; nil when the router has no summary
	// of the replica that counts.
	Summary Matcher
	// Hash is HashID(ID), precomputed by the view.
	Hash uint64
	// PendingPrefillBlocks is the prefill work queued at the replica, in
	// blocks, that a new request would wait behind.
	PendingPrefillBlocks float64
	// NetworkMs is the cost of reaching the replica from this router.
	NetworkMs float64
	// BlockMs is the replica's prefill time per block; 0 means the
	// policy's default.
	BlockMs float64
	// Detail holds what a decision rarely reads (ID, SeqMs, SlotAgeMs),
	// read through c.ID(), c.SeqMs() and c.SlotAgeMs(), which take nil
	// for the zero Detail: a view (or a test's) that leaves it out costs
	// an empty ID, never a panic on the request path. The view that
	// fills a candidate sets it, to storage of its own: a Candidate
	// copied shares its Detail. Pick reads it only of a candidate with no
	// free slot.
	Detail *Detail
	// InFlight is the number of requests in flight at the replica.
	InFlight int32
	// Running and Waiting are the engine's own counts of sequences it runs
	// and requests it queues (vLLM num_requests_running/waiting, SGLang
	// num_running_reqs/num_queue_reqs), as last scraped; InFlight is the
	// router's faster signal in between scrapes.
	Running, Waiting int32
	// Slots is how many sequences the engine runs at once (max-num-seqs),
	// published or learned (SlotEstimate); 0 means unknown.
	Slots int32

	// match is filled by Pick. It is an int32 (a prompt of 2^31 blocks is
	// 2 TB of KV) so that it packs with the counts. Pick computes a
	// candidate's slot wait where it needs it instead of storing it, for
	// the same reason.
	match int32
	// Tier groups replicas by network distance (0: this router's region).
	// Cold requests are placed within the nearest tier.
	Tier int8
	// Stale reports that a summary exists but does not count: too old, or
	// its owner is suspect or gone.
	Stale bool
	// HasLoad reports that Running and Waiting are the engine's counts:
	// its last scrape published them. An engine that publishes none
	// (no such gauges on its /metrics, a generic OpenAI server) or whose
	// scrape fails reports 0 and 0, which say nothing: it never reads
	// as idle to the burst rule (hashPick).
	HasLoad bool
}

// Detail is what a decision rarely reads of a candidate.
type Detail struct {
	// ID names the replica the same way on every router (its URL).
	ID string
	// SeqMs is how long a request holds one of those slots on average
	// (prefill and decode), as the router measures on the requests it
	// proxies there; 0 means not measured yet (Policy.DefaultSeqMs).
	// With Slots it turns a full engine's queue into milliseconds: a slot
	// frees every SeqMs/Slots.
	SeqMs float64
	// SlotAgeMs is how long the oldest request in flight at the replica
	// has held it, as the replica's owner knows from the requests it
	// proxies; 0 means unknown. It dates the next free slot: SeqMs after
	// that request began, rather than SeqMs/Slots from now on average —
	// slots that filled in one burst free together, late, and slots held
	// by requests past the mean free soon.
	SlotAgeMs float64
	// Own is how many of the requests in flight at the replica this
	// router placed itself (its own dispatches and forwards, not the
	// requests other routers sent to a replica it owns), and Local
	// reports that this router owns the replica. InFlight is exact for
	// the replicas a router owns, with the requests the other routers
	// just sent them, and for the others it is their owner's last state
	// plus this router's own requests since; Own is known alike for
	// every replica. A cold request of a burst onto an idle cluster
	// spreads by it (hashPick).
	Own   int32
	Local bool
}

// Count32 is n as a Candidate's count: saturated at the int32 range
// (a count past two billion is past any engine's).
func Count32(n int) int32 {
	return int32(max(min(n, math.MaxInt32), math.MinInt32))
}

// seqAndAge are c's SeqMs and SlotAgeMs, 0 without a Detail.
func seqAndAge(c *Candidate) (seqMs, slotAgeMs float64) {
	if d := c.Detail; d != nil {
		return d.SeqMs, d.SlotAgeMs
	}
	return 0, 0
}

// ID is the replica's ID ("" without a Detail).
func (c *Candidate) ID() string {
	if c.Detail == nil {
		return ""
	}
	return c.Detail.ID
}

// SeqMs is Detail.SeqMs (0, not measured, without a Detail).
func (c *Candidate) SeqMs() float64 {
	if c.Detail == nil {
		return 0
	}
	return c.Detail.SeqMs
}

// SlotAgeMs is Detail.SlotAgeMs (0, unknown, without a Detail).
func (c *Candidate) SlotAgeMs() float64 {
	if c.Detail == nil {
		return 0
	}
	return c.Detail.SlotAgeMs
}

// HashID returns the rendezvous hash of a replica ID.
func HashID(id string) uint64 { return xxh3.HashString(id) }

// Request is a request as the router sees it: its chained block hashes.
type Request struct {
	// Hashes are the chained block hashes of the prompt.
	Hashes []uint64
	// Probes are summary.MakeProbes(nil, Hashes).
	Probes []summary.Probe
	// Root is the chain root (model scope), the key of prompts shorter
	// than one block.
	Root uint64
	// ClientKey is the hash of a routing key the client sent
	// (prompt_cache_key, a session header, bootstrap_room); 0 when none.
	// When set it is the cold-placement key, so every router places the
	// client's requests alike whatever their prompts; prefix summaries still
	// decide warm requests.
	ClientKey uint64
	// Concurrent is how many requests sharing this request's HeatKey the
	// router has in flight, this one included; 0 means unknown (as 1). A
	// prefix many requests want at once is worth a second copy: the
	// recompute of a move is shared by the requests that copy will serve,
	// so the weight of recompute is divided by Concurrent.
	Concurrent int
	// ForkBlocks is the depth, in blocks, of a stem this request shares
	// with the last request of its heat key without extending it
	// (Stem.Fork): a template, a document or a few-shot prompt that
	// requests leave by different continuations, whose copies serve
	// other requests, rather than a conversation's history, which only
	// its next turn extends. 0 when none is known.
	ForkBlocks int
}

// Stem is what a router remembers of the last request it decided under a
// heat key, to tell a stem many requests fork from (a hot template or
// document) from a conversation's history: that request's length in
// blocks, its best match when it was decided (the prefix some replica
// held) and the chained hash of that prefix. The zero value knows nothing.
// It is a value: the router keeps one per heat key, in a bounded map.
type Stem struct {
	Len, Depth int
	Hash       uint64
}

// Fork is the stem depth req shares with the request s remembers: the
// prefix that request matched, when req holds it too and is no longer than
// that request (so it does not extend it: a conversation's next turn
// holds its previous turn and is longer), else 0.
func (s Stem) Fork(req Request) int {
	d := s.Depth
	if d <= 0 || d > len(req.Hashes) || len(req.Hashes) > s.Len || req.Hashes[d-1] != s.Hash {
		return 0
	}
	return d
}

// StemOf is the record a router keeps of req, decided with best match
// match (Decision.BestMatch), for the next request of its heat key.
func StemOf(req Request, match int) Stem {
	if match <= 0 || match > len(req.Hashes) {
		return Stem{Len: len(req.Hashes)}
	}
	return Stem{Len: len(req.Hashes), Depth: match, Hash: req.Hashes[match-1]}
}

// HeatKey is the key a router counts in-flight requests by for
// Request.Concurrent: the chained hash of block KeyBlocks-1 (the prompt's
// head, past a one-block system prompt), or the root of a shorter prompt.
// A hot prompt's requests share it; a conversation's turns share it but
// arrive one at a time.
func (p Policy) HeatKey(req Request) uint64 {
	if len(req.Hashes) == 0 {
		return req.Root
	}
	return req.Hashes[min(len(req.Hashes)-1, max(p.KeyBlocks-1, 0))]
}

// Reason says why a replica was picked; it is a metric label.
type Reason string

// The reasons of a decision.
const (
	ReasonPrefix        Reason = "prefix"         // cheapest estimated TTFT, using a prefix match
	ReasonSpill         Reason = "spill"          // the cheapest was over the load bound
	ReasonFallbackCold  Reason = "fallback-cold"  // no replica holds more than the common prefix
	ReasonFallbackStale Reason = "fallback-stale" // no summary counts (stale, suspect, missing)
	ReasonNone          Reason = "none"           // no candidate
)

// Reasons lists every reason, for metric initialisation.
var Reasons = []Reason{ReasonPrefix, ReasonSpill, ReasonFallbackCold, ReasonFallbackStale, ReasonNone}

// Decision is the outcome of Pick.
type Decision struct {
	// Index of the chosen candidate, -1 when there was none.
	Index int
	// Reason the candidate was chosen.
	Reason Reason
	// Match is the chosen replica's predicted prefix match in blocks.
	Match int
	// BestMatch is the longest match of any candidate.
	BestMatch int
	// CommonMatch is the common prefix (held by at least half, and two).
	CommonMatch int
	// Key is the consistent-hashing key of the request.
	Key uint64
}

// Policy holds the tunables of the decision. docs/DESIGN.md gives the
// reason for each default and the grid of simulations that checks it
// (docs/SIMULATION.md); DefaultPolicy is the "default" profile.
type Policy struct {
	// LoadFactor is the bound c of consistent hashing with bounded loads,
	// applied to cold placement on queued prefill: a replica takes a cold
	// request only while its queued prefill is within c times the mean
	// plus the request's own work. 1.25 is the value of the original
	// paper's experiments, HAProxy's hash-balance-factor documentation and
	// SMG's prefix hash. Warm requests are not held to it: their score
	// already weighs queued work against the recompute a move would cost.
	LoadFactor float64
	// InFlightFactor bounds in-flight requests at that many times the
	// mean, counting one more request per replica so that a small cluster
	// with a handful of requests never trips it (the bound is
	// ceil(f × (in-flight + replicas) / replicas), 4 with 3 requests on 4
	// replicas). A replica known to have a free sequence slot is never
	// held to it: it can start the request at once. It is a hot-spot guard
	// for engines whose slots are unknown, not a balancer.
	InFlightFactor float64
	// KeyBlocks is the minimum depth, in blocks, of a cold request's key;
	// the key is the block after the common prefix, and at least block
	// KeyBlocks-1. Two blocks skip a one-block system prompt even when the
	// common prefix is unknown (no summaries), so a router that sees
	// nothing keys a conversation where a router that sees everything does.
	KeyBlocks int
	// MinExcessBlocks is how many blocks beyond the common prefix a match
	// must hold to count as a prefix hit. One block is the smallest reuse
	// the hashing can see.
	MinExcessBlocks int
	// DefaultBlockMs is the prefill time per block used when the view has
	// no measured one. Only its ratio to NetworkMs and SeqMs matters; 20 ms
	// is 256 tokens at ~13k tokens/s, a mid-size model on one modern GPU.
	DefaultBlockMs float64
	// RecomputeWeight is what a block the replica lacks costs in the
	// score, in units of its prefill time. Recomputing a prefix that
	// another replica holds costs this request the prefill, and costs the
	// cluster a second copy of the prefix (evicting someone else's blocks)
	// and the queueing of every request behind that work; 1 would count
	// only the first. A warm request moves off its holder only when the
	// wait it saves exceeds RecomputeWeight times the prefill it adds.
	RecomputeWeight float64
	// DefaultSeqMs is how long a request holds a sequence slot when the
	// router has not measured it yet (Candidate.SeqMs is 0). It only
	// prices the wait at an engine whose slots are full before the first
	// request there has finished.
	DefaultSeqMs float64
}

// DefaultPolicy returns the documented defaults, the "default" profile.
func DefaultPolicy() Policy {
	return Policy{LoadFactor: 1.25, InFlightFactor: 2, KeyBlocks: 2, MinExcessBlocks: 1, DefaultBlockMs: 20,
		RecomputeWeight: 16, DefaultSeqMs: 10000}
}

// Pick chooses a replica for req among cands. It writes only the
// candidates' private fields, so callers may reuse the slice.
func (p Policy) Pick(req Request, cands []Candidate) Decision {
	if len(cands) >= pruneMin && len(cands) <= pruneMax {
		// The candidates' matches side by side, so that the warm pass
		// can find the few worth pricing without reading every
		// candidate again (warm.go).
		var ms [pruneMax]int32
		return p.pick(req, cands, ms[:len(cands)])
	}
	return p.pick(req, cands, nil)
}

// pick is Pick with ms, when not nil, the storage for every candidate's
// match (len(cands) of it); without it the warm pass prices every
// candidate.
func (p Policy) pick(req Request, cands []Candidate, ms []int32) Decision {
	if len(cands) == 0 {
		return Decision{Index: -1, Reason: ReasonNone}
	}
	n := len(req.Probes)
	fresh, stale, best, inFlight, queued, known := 0, 0, 0, 0, 0, 0
	pending := 0.0
	var hist [65]int32 // matches capped for the common-prefix vote
	var histOver []int32
	// What the later passes would otherwise each read every candidate
	// for: the nearest tier and how many of those that count could start
	// a request at once. The bounds warmPricing prunes with are a warm
	// decision's only (pruneBounds).
	tier := cands[0].Tier
	canKnown := 0
	defBm := p.DefaultBlockMs
	// The answers of the batch the last candidate's cell was of (Batch):
	// read here rather than through a call per candidate.
	var batch *Batch
	var batchRes []int
	// Two loops, the loads' and the matches', the first and the usual
	// part of the second without a call (a call in a loop makes the
	// compiler keep its running sums on the stack, a store and a load
	// each per candidate).
	for i := range cands {
		c := &cands[i]
		tier = min(tier, c.Tier)
		can := canStart(c)
		// A stale candidate's load is as unknown as its cache: it neither
		// counts towards the mean nor is held to the bound (a router that
		// cannot talk to the owner must place requests as if it knew
		// nothing, exactly as consistent hashing does).
		if c.Stale {
			stale++
		} else {
			inFlight += int(c.InFlight)
			queued += queuedAt(c)
			pending += c.PendingPrefillBlocks
			known++
			if can {
				canKnown++
			}
		}
	}
	// The matches of the candidates whose summary is a cell of the batch
	// the first summary's is (the mesh's candidates), read without a call
	// until one is not, or its match is past hist; the rest, in the
	// general loop below.
	i0 := 0
	if n > 0 {
		for i := range cands {
			if s := cands[i].Summary; s != nil {
				if bc, ok := s.(*BatchCell); ok {
					batch, batchRes = bc.b, bc.b.answer(req.Probes)
				}
				break
			}
		}
	}
	for ; i0 < len(cands); i0++ {
		c := &cands[i0]
		m := 0
		if s := c.Summary; s == nil {
			c.match = 0
			if ms != nil {
				ms[i0] = 0
			}
			continue
		} else if n > 0 {
			bc, ok := s.(*BatchCell)
			if !ok || bc.b != batch {
				break
			}
			if m = batchRes[bc.i]; m >= len(hist) {
				break
			}
		}
		c.match = int32(m)
		if ms != nil {
			ms[i0] = int32(m)
		}
		fresh++
		best = max(best, m)
		if m != 0 {
			hist[m]++
		}
	}
	for i := i0; i < len(cands); i++ {
		c := &cands[i]
		c.match = 0
		if ms != nil {
			ms[i] = 0
		}
		if c.Summary == nil {
			continue
		}
		m := 0
		if n > 0 {
			if bc, ok := c.Summary.(*BatchCell); ok {
				if bc.b != batch {
					batch, batchRes = bc.b, bc.b.answer(req.Probes)
				}
				m = batchRes[bc.i]
			} else {
				m = c.Summary.Match(req.Probes)
			}
		}
		c.match = int32(m)
		if ms != nil {
			ms[i] = int32(m)
		}
		fresh++
		best = max(best, m)
		// commonPrefix never reads hist[0]; counting the many zeros of a
		// thousand candidates into one slot would chain every iteration
		// through it.
		if m == 0 {
			continue
		}
		if m < len(hist) {
			hist[m]++
		} else {
			if histOver == nil {
				histOver = make([]int32, n+1)
			}
			histOver[m]++
		}
	}
	common := commonPrefix(hist[:], histOver, fresh)
	counted := known
	known = max(known, 1)
	lim := limits{inFlight: p.inFlightBound(inFlight, known), queued: p.queueBound(queued, known), work: math.Inf(1), blocks: n}
	cold := lim
	cold.work = p.LoadFactor * pending / float64(known)
	if fresh < len(cands) || req.ClientKey != 0 {
		// The next turn cannot count on summaries to find where this
		// one went (or the client's key promises that every router
		// places its requests alike): keep placement close to what every
		// router computes alone, allowing a queue of the request's own
		// size.
		cold.work += float64(max(1, n-common))
	}
	cold.cold = true
	d := Decision{BestMatch: best, CommonMatch: common, Key: p.key(req, common)}

	// Cold, or the replica consistent hashing names is one this router
	// cannot see (its owner is partitioned away or suspect): place it by
	// consistent hashing.
	//
	// A client key promises that every router places the client's
	// requests alike; one block of excess is what a single false positive
	// of one summary produces (a new prompt of one or two blocks then
	// looks warm at one router and cold at another), so it takes two to
	// override the key. The key keeps a conversation together anyway.
	minExcess := max(1, p.MinExcessBlocks)
	if req.ClientKey != 0 {
		minExcess++
	}
	isCold := fresh == 0 || best-common < minExcess
	home := -1
	if isCold || stale > 0 { // with no stale candidate the home cannot be stale
		// A client key promises that every router places the client's
		// requests alike; the shortest wait would follow this router's
		// view of the loads, which another router does not share.
		home = p.hashPick(cands, int(tier), d.Key, cold, common, fresh == len(cands) && req.ClientKey == 0, stale == 0)
	}
	if isCold || (home >= 0 && cands[home].Stale) {
		d.Reason = ReasonFallbackCold
		if cands[home].Stale {
			d.Reason = ReasonFallbackStale
		}
		d.Index, d.Match = home, int(cands[home].match)
		return d
	}

	// Warm: the estimated time to first token, plus the recompute a
	// replica lacking part of the prefix would add, weighted. The holder
	// has the least recompute, so it keeps the request while it can start
	// it at once (no wait, no queued prefill) and loses it only when the
	// wait it would impose exceeds RecomputeWeight times the prefill the
	// move adds; a move goes to the next holder first, whose recompute is
	// smallest.
	rw := p.RecomputeWeight
	if req.Concurrent > 1 {
		holders, startable := holdersOf(cands, ms, best)
		if req.Concurrent > holders && !startable {
			rw = 1
		}
	}
	// A forked stem's copy is not dead weight: the stem's other requests
	// use it too (a conversation's history is used only by its next
	// turn, which follows the copy and orphans the old one). So when no
	// holder can start the request and free slots are not scarce (at
	// least half the replicas could start it at once), the blocks of the
	// stem a replica lacks cost their prefill time, weight 1: the request
	// recomputes the stem where it starts now rather than queue at a full
	// holder longer than that takes. When fewer replicas can start it,
	// the copy would take the last free slots and lengthen the binding
	// resource's work, and the stem weighs RecomputeWeight like any
	// prefix.
	fork, stemWeight := 0, rw
	if req.ForkBlocks > 0 {
		if _, startable := holdersOf(cands, ms, best); !startable && counted > 0 && 2*canKnown >= counted {
			fork, stemWeight = min(req.ForkBlocks, n), 1
		}
	}
	w := warmPricing{p: p, cands: cands, lim: lim, key: d.Key, n: n, best: best, fork: fork,
		rw: rw, stemWeight: stemWeight}
	pruned := false
	if ms != nil {
		minNet, minQueued, minBm, finite := pruneBounds(cands, defBm)
		pruned = w.bounded(best, minNet, minQueued, minBm, finite)
	}
	if pruned {
		w.choosePruned(ms, best)
	} else {
		w.chooseAll()
	}
	chosen := w.chosen
	if chosen < 0 { // cannot happen: someone is at or below the mean
		chosen = w.cheapest
	}
	// A spill that would copy the prefix onto a busy replica (no free
	// slot, or prefill queued) only moves the queue and adds the copy's
	// prefill to it: the request stays with the cheapest.
	if cheapest := w.cheapest; chosen != cheapest && int(cands[chosen].match) < int(cands[cheapest].match) && !idle(&cands[chosen]) {
		chosen = cheapest
	}
	d.Index, d.Match, d.Reason = chosen, int(cands[chosen].match), ReasonPrefix
	if chosen != w.cheapest {
		d.Reason = ReasonSpill
	}
	return d
}

// pruneBounds is what warmPricing prunes with, over every candidate: the
// least network cost, queued prefill time and block time, and finite, a
// sum of the float fields a cost reads (the slot wait's only of the
// candidates that would be asked it), so that a NaN or an infinity turns
// pruning off rather than making it guess. Only a warm decision asks it,
// after the first pass: a cold one (most requests of a chat trace are a
// conversation's first turn) does not pay for it.
func pruneBounds(cands []Candidate, defBm float64) (minNet, minQueued, minBm, finite float64) {
	minNet, minQueued, minBm = math.Inf(1), math.Inf(1), math.Inf(1)
	for i := range cands {
		c := &cands[i]
		// blockMs by hand, the default read once (the method on a
		// Policy value copied the policy for every candidate), and
		// comparisons, not min (its care for NaN and -0 costs branches;
		// finite catches a NaN).
		bm := c.BlockMs
		if !(bm > 0) {
			bm = defBm
		}
		if c.NetworkMs < minNet {
			minNet = c.NetworkMs
		}
		if q := bm * c.PendingPrefillBlocks; q < minQueued {
			minQueued = q
		}
		if bm < minBm {
			minBm = bm
		}
		finite += c.NetworkMs + c.PendingPrefillBlocks + c.BlockMs
		if !canStart(c) { // only these are asked their slot wait
			seq, age := seqAndAge(c)
			finite += seq + age
		}
	}
	return minNet, minQueued, minBm, finite
}

// holdersOf counts the candidates holding best blocks of the request (no
// candidate holds more) and reports whether one of them could start it at
// once; ms, when not nil, is their matches side by side.
func holdersOf(cands []Candidate, ms []int32, best int) (holders int, startable bool) {
	if ms == nil {
		for i := range cands {
			if int(cands[i].match) >= best {
				holders++
				startable = startable || canStart(&cands[i])
			}
		}
		return holders, startable
	}
	for i, m := range ms {
		if int(m) >= best {
			holders++
			startable = startable || canStart(&cands[i])
		}
	}
	return holders, startable
}

// blockMs is a candidate's prefill time per block.
func (p *Policy) blockMs(c *Candidate) float64 {
	if c.BlockMs > 0 {
		return c.BlockMs
	}
	return p.DefaultBlockMs
}

// waitMs is a candidate's estimated wait to start a request: its queued
// prefill and its slot wait, in ms.
func (p *Policy) waitMs(c *Candidate) float64 {
	slot := 0.0
	if slotsAhead(c) > 0 {
		slot = p.slotWaitMs(c)
	}
	return p.blockMs(c)*c.PendingPrefillBlocks + slot
}

// slotWaitMs estimates how long a new request would wait at c for a
// sequence slot: nothing while one is free, else the time for enough of
// them to free: the first when the oldest request in flight ends (SeqMs
// after it began) when the router knows its age, the rest one every
// SeqMs/Slots. The router's in-flight count is
// the fast signal of how many requests the engine holds; with unknown
// slots the last scrape's waiting count says whether it queues.
func (p *Policy) slotWaitMs(c *Candidate) float64 {
	ahead := slotsAhead(c)
	if ahead <= 0 {
		return 0
	}
	slots := int(c.Slots)
	if slots <= 0 { // ahead > 0 with unknown slots: the engine queues
		slots = max(int(c.Running), 1)
	}
	seqMs, slotAgeMs := seqAndAge(c)
	seq := seqMs
	if seq <= 0 {
		seq = p.DefaultSeqMs
	}
	per := seq / float64(slots)
	if slotAgeMs > 0 && seqMs > 0 {
		// The first slot frees when the oldest request ends, the rest
		// one every SeqMs/Slots after it.
		return max(seq-slotAgeMs, 0) + float64(ahead-1)*per
	}
	return float64(ahead) * per
}

// slotsAhead is how many sequence slots must free before c starts a new
// request: its in-flight count past its slots, or with unknown slots the
// last scrape's waiting count and this request; 0 or less when one is
// free (or none is known to be taken). It inlines where slotWaitMs does
// not: a decision asks each of a thousand candidates, most of which have
// a free slot, and calls slotWaitMs only for the others.
func slotsAhead(c *Candidate) int {
	switch {
	case c.Slots > 0:
		return int(c.InFlight) + 1 - int(c.Slots)
	case c.Waiting > 0:
		return int(c.Waiting) + 1
	}
	return 0
}

// InFlightBound is the most requests a candidate may have in flight for
// Pick to admit one more, unless it can start it at once: the
// hot-spot guard over cands, stale ones not counted. A router serving a
// forwarded hint uses it to tell "full" from the decider's snapshot noise.
func (p Policy) InFlightBound(cands []Candidate) int {
	inFlight, known := 0, 0
	for i := range cands {
		if !cands[i].Stale {
			inFlight += int(cands[i].InFlight)
			known++
		}
	}
	return p.inFlightBound(inFlight, max(known, 1))
}

// KeepHint is the owner's check of a decision another router made for
// one of its replicas, cands[i], with the owner's exact view of its own
// replicas (the decider's view of them is up to a gossip interval old, and
// blind to the other routers' dispatches since): it keeps the hint while
// the replica can start the request at once (a free sequence slot, nothing
// waiting), its queued prefill is within LoadFactor times the mean, and
// it is under twice the in-flight bound. Otherwise the owner decides again
// among its own replicas with Pick. Requests that
// several routers sent in the same instant then spread at the owner
// instead of piling on the replica that looked idle to all of them.
func (p Policy) KeepHint(cands []Candidate, i int) bool {
	c := &cands[i]
	if !canStart(c) {
		return false
	}
	inFlight, known, pending := 0, 0, 0.0
	for j := range cands {
		if !cands[j].Stale {
			inFlight += int(cands[j].InFlight)
			pending += cands[j].PendingPrefillBlocks
			known++
		}
	}
	known = max(known, 1)
	if !idle(c) && int(c.InFlight)+1 > 2*p.inFlightBound(inFlight, known) {
		return false
	}
	return c.PendingPrefillBlocks <= p.LoadFactor*pending/float64(known)
}

// queueBound is the most requests an engine may queue for slots for Pick
// to add one more: InFlightFactor times the mean queue with one more
// request per replica, so that with little queueing anywhere a holder may
// queue a few before its requests spill.
func (p Policy) queueBound(queued, known int) int {
	return int(math.Ceil(p.InFlightFactor * float64(queued+known) / float64(known)))
}

func (p Policy) inFlightBound(inFlight, known int) int {
	return int(math.Ceil(p.InFlightFactor * float64(inFlight+1) / float64(known)))
}

// limits are the bounded-load limits of one decision.
type limits struct {
	inFlight int     // for engines of unknown slots
	queued   int     // requests waiting for a slot
	work     float64 // queued prefill, for cold placement
	cold     bool    // placement by hashing: also skip replicas that would queue it
	blocks   int     // the request's blocks
}

// admits is the hot-spot guard. An engine that holds at least half of the
// request and can start it at once (a free slot, nothing waiting) with
// less prefill queued than the blocks it holds — so it is still the
// quickest place for the request, and no prefill hot spot — always admits
// it: a conversation's next turn stays. Any other admits it while its
// queue for slots stays within the bound on queued requests
// (InFlightFactor times the mean queue, plus one per replica) — a hot
// prefix whose holder queues far more than the others spills to the next
// holder, which then holds it too — and, when its slots are unknown, while
// its in-flight count stays within InFlightFactor times the mean.
func (l limits) admits(c *Candidate) bool {
	if c.Stale {
		return true
	}
	if l.cold && (c.PendingPrefillBlocks > l.work || !canStart(c)) {
		return false
	}
	if !l.cold && canStart(c) && 2*int(c.match) >= l.blocks && c.PendingPrefillBlocks <= float64(c.match) {
		return true
	}
	q := queuedAt(c)
	if q > 0 && q+1 > l.queued {
		return false
	}
	// With known slots the queue says all; otherwise the in-flight count
	// stands in for it.
	return c.Slots > 0 || int(c.InFlight)+1 <= l.inFlight
}

// admitsCold is admits for cold limits (l.cold: hashPick's), in few enough lines
// to inline: a candidate that can start the request has nobody queued
// for a slot (queuedAt is 0), so only the work and in-flight bounds are
// left to check. TestAdmitsCold holds it to admits.
func (l limits) admitsCold(c *Candidate) bool {
	return c.Stale || !(c.PendingPrefillBlocks > l.work) && canStart(c) && (c.Slots > 0 || int(c.InFlight)+1 <= l.inFlight)
}

// idle reports that c can start a request at once: a sequence slot known
// to be free and no prefill queued. (With unknown slots an empty waiting
// queue says too little: the guard applies.)
func idle(c *Candidate) bool {
	return canStart(c) && c.PendingPrefillBlocks < 1
}

// queuedAt is how many requests c's engine holds waiting for a slot, as far
// as the router knows: its in-flight count over its slots, or with
// unknown slots the last scrape's waiting count.
func queuedAt(c *Candidate) int {
	if c.Slots > 0 {
		return max(0, int(c.InFlight)-int(c.Slots))
	}
	return int(c.Waiting)
}

// canStart reports that c would not queue a new request for a sequence
// slot, as far as the router knows.
func canStart(c *Candidate) bool {
	if c.Slots > 0 {
		return c.InFlight < c.Slots
	}
	return c.Waiting == 0
}

// commonPrefix returns the longest match held by at least half of the
// fresh candidates, and by at least two: with two replicas, the one
// holding a conversation must not make it "common". (A strict majority
// would do that too, but then a system prompt held by half the replicas
// while a mesh warms up draws every request to them.)
func commonPrefix(hist, over []int32, fresh int) int {
	if fresh == 0 {
		return 0
	}
	need := int32(max(2, (fresh+1)/2))
	var atLeast int32
	for m := len(over) - 1; m >= len(hist); m-- {
		atLeast += over[m]
		if atLeast >= need {
			return m
		}
	}
	for m := len(hist) - 1; m > 0; m-- {
		atLeast += hist[m]
		if atLeast >= need {
			return m
		}
	}
	return 0
}

// key is the consistent-hashing key: the client's routing key when it
// sent one, else the chained hash of the block KeyBlocks past the common
// prefix (or the last full block of a shorter prompt), which covers
// everything before it.
func (p Policy) key(req Request, common int) uint64 {
	if req.ClientKey != 0 {
		return req.ClientKey
	}
	idx := min(len(req.Hashes)-1, max(common, p.KeyBlocks-1))
	if idx < 0 {
		return req.Root
	}
	return req.Hashes[idx]
}

// hashPick is rendezvous hashing with bounded loads over the nearest tier
// (tier, the least of the candidates' tiers):
// the candidate with the highest weight for key among those under the
// limits (a slot to start it, queued prefill, the hot-spot guard). With
// leastWait it takes the shortest estimated wait among them instead, ties
// in rendezvous order (join-the-shortest-queue; an idle cluster still
// places by the key), which cuts the queueing of cold requests — most
// requests of a chat trace are a conversation's first turn. That is only
// safe when every candidate's summary counts: the next turn then finds
// the prefix by summary wherever it went. Without that (startup, a
// partition, no summaries) placement must be the one every router
// computes alone: the first choice. When no candidate is under the
// limits, the one with the shortest wait takes it. Candidates whose
// summary holds a common prefix longer than one block (a hot prompt, not
// a system prompt still spreading) go first: recomputing it costs. lim
// are cold limits (lim.cold).
//
// noStale reports that no candidate is stale: every one admitted can
// then start the request (admitsCold), so none has a slot wait.
func (p Policy) hashPick(cands []Candidate, tier int, key uint64, lim limits, common int, leastWait, noStale bool) int {
	// First among the holders of the common prefix, then among all. A
	// copy of a common prefix longer than one block (a hot prompt) goes
	// only to an idle replica (a free slot, no prefill queued): on a busy
	// one its prefill delays the requests queued there, and the request
	// queues at the holder with the shortest wait instead.
	hot := common > 1
	// A thousand candidates are asked the limits and their wait: both by
	// hand here (admitsCold, waitMs's own lines), not through calls, which
	// the compiler does not inline.
	defBm := p.DefaultBlockMs
	for pass := 0; pass < 2; pass++ {
		f := coldFilter{lim: lim, tier: tier, common: common, hot: hot, holdersOnly: pass == 0}
		var first, shortest, second int
		if !hot && noStale {
			// The usual cold decision (no hot prompt, no stale
			// candidate): one scan without the filter's other terms or
			// a slot wait, in a loop of its own; the second pass would
			// be the same scan.
			first, shortest, second = scanCold(cands, tier, key, lim.work, lim.inFlight, defBm)
			if first < 0 {
				break
			}
		} else {
			first, shortest, second = p.scanColdAll(cands, f, key, defBm)
		}
		switch {
		case first < 0:
			continue
		case leastWait && !idle(&cands[first]) && burst(cands, tier):
			// The key's first choice is busy, so the shortest wait would
			// move the request off it too and the next turn will not
			// retrace it by the key anyway (it finds it by summary),
			// and the engines last reported idle:
			// the load in view is a burst sent since, and the view of
			// it is lopsided. This router sees the requests the other
			// routers just sent to the replicas it owns, but theirs at
			// the other replicas only with their owners' next states.
			// Routers that each place their burst by such a view push
			// it onto the replicas they do not own, all onto the same
			// ones (five cold turns on one replica of four slots in
			// issue 7's chat). What a router knows alike of every
			// replica is its own share of the load: spreading its own
			// requests evenly spreads the sum evenly, whatever the
			// others do at the same instant. The bound on queued
			// prefill is left out for the same reason: it is the mean
			// of those lopsided loads (a replica this router owns
			// exceeds it with the requests the others just sent there).
			// The spread still takes only a replica that can start the
			// request, and the shorter wait among equal shares.
			f.lim.work = math.Inf(1)
			return p.spread(cands, key, f)
		case leastWait:
			// Of the key's first two choices at the shortest wait, the
			// one with fewer requests in flight: a cold prefill delays
			// every request that arrives behind it, and a replica's
			// arrivals follow its requests in flight (Little's law). Two
			// choices by the key, not the least loaded of all, so that
			// routers deciding on the same snapshot do not herd.
			if second >= 0 && cands[second].InFlight < cands[shortest].InFlight {
				return second
			}
			return shortest
		}
		return first
	}
	// Over the limits everywhere: the shortest wait among the holders of
	// a hot prompt, or among all when no candidate of the tier holds it
	// (its holders are stale or in another tier).
	for _, skipLacking := range [...]bool{hot, false} {
		fallback := -1
		var fallbackW uint64
		var fallbackWait float64
		for i := range cands {
			c := &cands[i]
			if int(c.Tier) != tier || (skipLacking && lacks(c, common)) {
				continue
			}
			w := weight(key, c.Hash)
			if wait := p.waitMs(c); fallback < 0 || wait < fallbackWait || (wait == fallbackWait && w > fallbackW) {
				fallback, fallbackW, fallbackWait = i, w, wait
			}
		}
		if fallback >= 0 {
			return fallback
		}
	}
	return -1 // no candidate in the tier: cannot happen, tier is the least of theirs
}

// scanColdAll is one pass of hashPick over cands: among the candidates
// f admits (f.eligible), first has the highest rendezvous weight for
// key, shortest the shortest estimated wait, ties in rendezvous order,
// and second the runner-up in rendezvous order at that wait; -1 for
// none. The ranking is scanCold's, written out in both: a shared
// ranker would be a struct of seven fields, which the compiler keeps
// in memory, not registers (scanCold's point).
func (p Policy) scanColdAll(cands []Candidate, f coldFilter, key uint64, defBm float64) (first, shortest, second int) {
	first, shortest, second = -1, -1, -1
	var firstW, shortestW, secondW uint64
	var shortestWait float64
	for i := range cands {
		c := &cands[i]
		if !f.eligible(c) {
			continue
		}
		w := weight(key, c.Hash)
		if first < 0 || w > firstW {
			first, firstW = i, w
		}
		slot, bm := 0.0, c.BlockMs
		if slotsAhead(c) > 0 {
			slot = p.slotWaitMs(c)
		}
		if !(bm > 0) { // blockMs
			bm = defBm
		}
		if wait := bm*c.PendingPrefillBlocks + slot; shortest < 0 || wait < shortestWait {
			shortest, shortestW, shortestWait, second = i, w, wait, -1
		} else if wait == shortestWait {
			if w > shortestW {
				second, secondW = shortest, shortestW
				shortest, shortestW = i, w
			} else if second < 0 || w > secondW {
				second, secondW = i, w
			}
		}
	}
	return first, shortest, second
}

// scanCold is scanColdAll when no candidate is stale and the prompt is
// not hot (cold limits of work and inFlight): the filter is the tier and
// admitsCold without its stale term, and the wait has no slot wait (a
// candidate admitted can start the request). It makes no call, so that
// its running bests stay in registers: scanColdAll's call of slotWaitMs
// spilled them to the stack on every candidate, the cold decision's
// largest cost after the weight itself. TestScanCold holds it to
// scanColdAll.
func scanCold(cands []Candidate, tier int, key uint64, work float64, inFlight int, defBm float64) (first, shortest, second int) {
	first, shortest, second = -1, -1, -1
	var firstW, shortestW, secondW uint64
	var shortestWait float64
	for i := range cands {
		c := &cands[i]
		if int(c.Tier) != tier || c.PendingPrefillBlocks > work || !canStart(c) || (c.Slots <= 0 && int(c.InFlight)+1 > inFlight) {
			continue
		}
		w := weight(key, c.Hash)
		if first < 0 || w > firstW {
			first, firstW = i, w
		}
		bm := c.BlockMs
		if !(bm > 0) { // blockMs
			bm = defBm
		}
		if wait := bm * c.PendingPrefillBlocks; shortest < 0 || wait < shortestWait {
			shortest, shortestW, shortestWait, second = i, w, wait, -1
		} else if wait == shortestWait {
			if w > shortestW {
				second, secondW = shortest, shortestW
				shortest, shortestW = i, w
			} else if second < 0 || w > secondW {
				second, secondW = i, w
			}
		}
	}
	return first, shortest, second
}

// coldFilter is which candidates one pass of hashPick places among.
type coldFilter struct {
	lim    limits
	tier   int
	common int
	// hot: the common prefix is longer than one block (a hot prompt).
	// holdersOnly: the first pass, among the holders of a hot prompt;
	// the second admits a replica lacking it only when idle.
	hot, holdersOnly bool
}

// eligible reports that c is in the nearest tier, under the limits, and
// holds a hot common prefix or (second pass) is idle to copy it.
func (f coldFilter) eligible(c *Candidate) bool {
	if int(c.Tier) != f.tier || !f.lim.admitsCold(c) {
		return false
	}
	if !f.hot || !lacks(c, f.common) {
		return true
	}
	return !f.holdersOnly && idle(c)
}

// burst reports that the candidates of tier mix replicas this router
// owns with others and that every engine among them last reported
// nothing running or waiting: whatever is in flight was sent since, a
// burst onto an idle cluster, of which this router sees the other
// routers' part only at its own replicas. An engine whose counts are
// unknown (HasLoad false) is no evidence of an idle cluster: its zeros
// would make every busy first choice spread, which costs the key's
// placement for nothing (tried: it lost grid cells).
func burst(cands []Candidate, tier int) bool {
	local, remote := false, false
	for i := range cands {
		c := &cands[i]
		if int(c.Tier) != tier || c.Stale {
			continue
		}
		if !c.HasLoad || c.Running > 0 || c.Waiting > 0 {
			return false
		}
		if d := c.Detail; d != nil && d.Local {
			local = true
		} else {
			remote = true
		}
	}
	return local && remote
}

// spread is the eligible candidate with the fewest of this router's own
// requests in flight (Detail.Own), ties to the shortest estimated wait,
// then in rendezvous order for key.
func (p Policy) spread(cands []Candidate, key uint64, f coldFilter) int {
	best := -1
	var bestOwn int32
	var bestWait float64
	var bestW uint64
	for i := range cands {
		c := &cands[i]
		if !f.eligible(c) {
			continue
		}
		var own int32
		if d := c.Detail; d != nil {
			own = d.Own
		}
		wait, w := p.waitMs(c), weight(key, c.Hash)
		if best < 0 || own < bestOwn || (own == bestOwn && (wait < bestWait || (wait == bestWait && w > bestW))) {
			best, bestOwn, bestWait, bestW = i, own, wait, w
		}
	}
	return best
}

// lacks reports that c's summary counts and lacks the common prefix.
func lacks(c *Candidate, common int) bool {
	return c.Summary != nil && int(c.match) < common
}

// weight is the rendezvous weight of a replica for a key.
func weight(key, replica uint64) uint64 {
	z := key ^ replica
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// SlotEstimate learns an engine's sequence slots (max-num-seqs) from its
// scraped running and waiting counts when the engine does not publish
// them: an engine that queues while running k sequences has k slots; one
// that runs more than the estimate has at least that many. Until it has
// queued once, the estimate is 0 (unknown). It is a value: the owner of
// the scrape keeps it and puts Slots in the candidate.
type SlotEstimate struct {
	// Slots is the estimate; 0 until the engine has been seen queueing.
	Slots int
}

// Observe returns the estimate updated with one scrape.
func (e SlotEstimate) Observe(running, waiting int) SlotEstimate {
	switch {
	case waiting > 0 && running > 0:
		e.Slots = running
	case e.Slots > 0 && running > e.Slots:
		e.Slots = running
	}
	return e
}
