// Package kvtrack relates one engine's KV-cache events to the router's
// text blocks, so that an owned replica's summary drops exactly what the
// engine evicted.
//
// The router has no tokenizer and the engine's block hashes are of
// tokens, so the two never meet by hash. They meet through the requests
// the router sent: the blocks an engine stores while serving a request
// form a chain (each BlockStored names its parent), and the request's
// usage says where that chain ends (prompt_tokens + completion_tokens)
// and where it began (cached_tokens: the first block the engine computed
// rather than found). When the answer comes, the tracker finds the chain
// of engine blocks stored since the request was sent whose depth matches,
// and maps each of the request's text blocks onto the engine block
// holding its last byte, reading bytes as tokens in proportion (the
// prompt's bytes per its tokens, the answer's per its own). Holding a
// text block then means holding that engine block and its ancestors, as
// a prefix cache does. A BlockRemoved drops the text blocks mapped onto
// the removed block and onto every block below it (a chain with a hole is
// useless past it); AllBlocksCleared drops all.
//
// Everything is bounded: the engine blocks known (oldest forgotten
// first), the answers waiting for their blocks, the blocks scanned per
// attribution. What is forgotten or cannot be related (events lost,
// blocks stored before the subscription, a request whose chain is not
// found) falls back to the router's prediction and the usage correction,
// and is counted.
package kvtrack

import (
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/internal/kvevents"
)

// Summaries is what a Tracker changes of its replica's summary.
type Summaries interface {
	// Evicted says the engine no longer holds these text blocks. It
	// reports false when the summary refused some (its record of
	// forgotten blocks is full): the caller rebases.
	Evicted(replicaID string, hashes []uint64) bool
	// Rebase makes the summary hold exactly these text blocks.
	Rebase(replicaID string, held []uint64)
	// Record says the engine holds these text blocks (an answer was
	// related to engine blocks it has not removed).
	Record(replicaID string, hashes []uint64)
}

// Answer is what the router learnt of one request an owned replica
// answered: its text blocks and the engine's usage.
type Answer struct {
	// Hashes are the chained text blocks of the prompt and the answer as
	// the next turn renders it; the prompt's come first.
	Hashes []uint64
	// PromptBytes and TextBytes are the prompt's canonical text length
	// and that of prompt and answer together.
	PromptBytes, TextBytes int
	// BlockBytes is the text bytes per text block.
	BlockBytes int
	// Usage.
	PromptTokens, CompletionTokens, CachedTokens int64
	// Sent is when the request was sent to the replica.
	Sent time.Time
}

// Config bounds a Tracker.
type Config struct {
	// MaxBlocks is the most engine blocks remembered (default 1<<17);
	// past it the oldest are forgotten (their text blocks fall back to
	// prediction).
	MaxBlocks int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

const (
	maxPending  = 256             // answers waiting for their blocks
	pendingFor  = 3 * time.Second // how long an answer waits
	sentSlack   = 50 * time.Millisecond
	maxScan     = 8192 // blocks scanned back per attribution
	defaultMax  = 1 << 17
	minMaxBlock = 64
)

// node is one engine block.
type node struct {
	parent    uint64
	hasParent bool
	depth     int // blocks above it; -1 unknown (its parent was not seen)
	stored    time.Time
	serial    uint64   // its place in the ring of stored blocks
	owned     bool     // attributed to a request
	kids      []uint64 // blocks stored with this one as parent
	texts     []uint64 // text blocks whose last byte it holds
}

// stamp is one place in the ring: a block stored again has a later one,
// and only its latest counts.
type stamp struct{ h, serial uint64 }

// Stats counts what a Tracker did.
type Stats struct {
	Blocks       int    `json:"engine_blocks"`
	TextBlocks   int    `json:"text_blocks"`
	Pending      int    `json:"pending_answers"`
	Attributed   uint64 `json:"attributed"`
	Unattributed uint64 `json:"unattributed"`
	Evicted      uint64 `json:"text_blocks_evicted"`
	Rebases      uint64 `json:"rebases"`
	Clears       uint64 `json:"clears"`
	Losses       uint64 `json:"losses"`
	// BlockSize is the engine's tokens per block (0 until a BlockStored).
	BlockSize int `json:"block_size"`
}

// Tracker relates one replica's engine blocks to text blocks. It is a
// kvevents.Handler, and safe for concurrent use.
type Tracker struct {
	id   string
	sums Summaries
	cfg  Config

	// sumMu orders what the tracker tells the summary as its state
	// changed: a relation and an eviction computed one after the other
	// reach the summary in that order (taken before mu).
	sumMu   sync.Mutex
	mu      sync.Mutex
	held    []uint64 // text blocks related since the summary was last told
	nodes   map[uint64]*node
	order   []stamp // engine blocks in the order stored (a ring)
	head, n int
	serial  uint64
	texts   map[uint64]uint64 // text block -> the engine block holding its end
	pending []Answer
	st      Stats
}

// New returns a tracker of replica id's engine.
func New(id string, sums Summaries, cfg Config) *Tracker {
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = defaultMax
	}
	cfg.MaxBlocks = max(cfg.MaxBlocks, minMaxBlock)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Tracker{id: id, sums: sums, cfg: cfg, nodes: map[uint64]*node{}, texts: map[uint64]uint64{},
		order: make([]stamp, cfg.MaxBlocks)}
}

// Stats returns the tracker's counters.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.st
	s.Blocks, s.TextBlocks, s.Pending = len(t.nodes), len(t.texts), len(t.pending)
	return s
}

// Batch applies one batch of the engine's events.
func (t *Tracker) Batch(b kvevents.Batch) {
	var gone []uint64
	clear := false
	t.sumMu.Lock()
	defer t.sumMu.Unlock()
	t.mu.Lock()
	now := t.cfg.Now()
	for _, e := range b.Events {
		switch e.Kind {
		case kvevents.BlockStored:
			t.stored(e, now)
		case kvevents.BlockRemoved:
			for _, h := range e.Hashes {
				gone = t.removeLocked(h, gone)
			}
		case kvevents.AllBlocksCleared:
			t.resetLocked()
			gone, clear = gone[:0], true
			t.st.Clears++
		}
	}
	t.retryLocked(now)
	held := t.takeHeldLocked()
	t.mu.Unlock()
	if clear {
		t.sums.Rebase(t.id, nil)
	}
	t.evict(gone)
	t.record(held)
}

// takeHeldLocked returns the text blocks related since the last call.
func (t *Tracker) takeHeldLocked() []uint64 {
	h := t.held
	t.held = nil
	return h
}

// record tells the summary that the engine holds the text blocks of
// answers just related. The router recorded them when the answer came;
// an eviction of an earlier copy of the same blocks, seen after that,
// may have forgotten them since.
func (t *Tracker) record(held []uint64) {
	if len(held) > 0 {
		t.sums.Record(t.id, held)
	}
}

// Lost forgets every engine block: what follows cannot be related to
// what came before. The summary is left as it is (prediction and the
// usage correction take over until new blocks are related).
func (t *Tracker) Lost(string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resetLocked()
	t.st.Losses++
}

func (t *Tracker) resetLocked() {
	clear(t.nodes)
	clear(t.texts)
	t.head, t.n = 0, 0
}

// evict tells the summary of text blocks the engine evicted; when the
// summary refuses, it is rebased on what the tracker knows is held.
func (t *Tracker) evict(gone []uint64) {
	if len(gone) == 0 {
		return
	}
	t.mu.Lock()
	t.st.Evicted += uint64(len(gone))
	t.mu.Unlock()
	if t.sums.Evicted(t.id, gone) {
		return
	}
	t.mu.Lock()
	held := make([]uint64, 0, len(t.texts))
	for h := range t.texts {
		held = append(held, h)
	}
	for _, a := range t.pending {
		held = append(held, a.Hashes...)
	}
	t.st.Rebases++
	t.mu.Unlock()
	t.sums.Rebase(t.id, held)
}

func (t *Tracker) stored(e kvevents.Event, now time.Time) {
	if e.BlockSize > 0 {
		t.st.BlockSize = e.BlockSize
	}
	parent, has := e.Parent, e.HasParent
	for _, h := range e.Hashes {
		if old := t.nodes[h]; old != nil { // stored again: its place may differ
			t.dropLocked(h, old)
		}
		nd := &node{parent: parent, hasParent: has, depth: -1, stored: now}
		if !has {
			nd.depth = 0
		} else if p := t.nodes[parent]; p != nil {
			p.kids = append(p.kids, h)
			if p.depth >= 0 {
				nd.depth = p.depth + 1
			}
		}
		t.nodes[h] = nd
		t.pushLocked(h, nd)
		parent, has = h, true
	}
}

// pushLocked appends h to the ring of stored blocks, forgetting the
// oldest block when it is full.
func (t *Tracker) pushLocked(h uint64, nd *node) {
	if t.n == len(t.order) {
		old := t.order[t.head]
		if od := t.nodes[old.h]; od != nil && od.serial == old.serial {
			t.dropLocked(old.h, od)
		}
		t.head = (t.head + 1) % len(t.order)
		t.n--
	}
	t.serial++
	nd.serial = t.serial
	t.order[(t.head+t.n)%len(t.order)] = stamp{h: h, serial: t.serial}
	t.n++
}

// dropLocked forgets an engine block without telling the summary (its
// text blocks fall back to prediction).
func (t *Tracker) dropLocked(h uint64, nd *node) {
	for _, th := range nd.texts {
		if t.texts[th] == h {
			delete(t.texts, th)
		}
	}
	delete(t.nodes, h)
}

// removeLocked drops engine block h and the blocks below it, appending to
// gone the text blocks they held.
func (t *Tracker) removeLocked(h uint64, gone []uint64) []uint64 {
	stack := []uint64{h}
	for steps := 0; len(stack) > 0 && steps < t.cfg.MaxBlocks; steps++ {
		h := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		nd := t.nodes[h]
		if nd == nil {
			continue
		}
		for _, th := range nd.texts {
			if t.texts[th] == h {
				delete(t.texts, th)
				gone = append(gone, th)
			}
		}
		for _, k := range nd.kids {
			if kd := t.nodes[k]; kd != nil && kd.parent == h {
				stack = append(stack, k)
			}
		}
		delete(t.nodes, h)
	}
	return gone
}

// Answered relates a request's text blocks to the engine blocks stored
// for it; when they have not all arrived yet, it waits for them (a
// bounded while).
func (t *Tracker) Answered(a Answer) {
	if len(a.Hashes) == 0 || a.PromptTokens <= 0 || a.PromptBytes <= 0 || a.BlockBytes <= 0 {
		return
	}
	a.Hashes = append([]uint64(nil), a.Hashes...)
	t.sumMu.Lock()
	defer t.sumMu.Unlock()
	t.mu.Lock()
	if t.attributeLocked(a, false) {
		held := t.takeHeldLocked()
		t.mu.Unlock()
		t.record(held)
		return
	}
	defer t.mu.Unlock()
	if len(t.pending) >= maxPending {
		t.pending = t.pending[1:]
		t.st.Unattributed++
	}
	t.pending = append(t.pending, a)
}

// retryLocked tries the waiting answers again after new blocks came; an
// answer waiting past pendingFor takes the chain as far as it got.
func (t *Tracker) retryLocked(now time.Time) {
	keep := t.pending[:0]
	for _, a := range t.pending {
		late := now.Sub(a.Sent) > pendingFor
		if t.attributeLocked(a, late) {
			continue
		}
		if late {
			t.st.Unattributed++
			continue
		}
		keep = append(keep, a)
	}
	clear(t.pending[len(keep):])
	t.pending = keep
}
