package kvtrack

import (
	"math"
	"time"
)

// attributeLocked finds the chain of engine blocks stored for answer a
// and maps a's text blocks onto it. It reports whether a is done with
// (related, or nothing to relate). Unless late, only a chain ending at
// the depth the usage names is taken; late, the deepest chain from the
// prompt's last block on is.
//
// The chain is told from others by four things the router knows: its
// blocks were stored after the request was sent; its depth is where the
// usage says the engine's computed tokens end (prompt_tokens +
// completion_tokens - 1, in full blocks); its first new block is at the
// depth of cached_tokens; and it descends from the engine block that the
// deepest of the request's cached text blocks is already mapped to (its
// anchor: an earlier turn of the same conversation put it there). The
// anchor is what tells apart the same turn of two conversations, whose
// depths are equal: without it one conversation's text blocks would be
// mapped onto the other's engine blocks, and an eviction of those would
// forget blocks the engine still holds. An answer with an anchor waits
// for a chain under it (until late). A chain ending at a leaf is taken
// before a block inside a longer chain (another request's, its blocks
// still being stored). Among several chains still equal (concurrent
// first turns of one length), the earliest stored is taken: an engine
// schedules first come, first served.
func (t *Tracker) attributeLocked(a Answer, late bool) bool {
	bs := int64(t.st.BlockSize)
	if bs <= 0 {
		return false
	}
	want := int((a.PromptTokens+a.CompletionTokens-1)/bs) - 1
	promptLeaf := int(a.PromptTokens/bs) - 1
	first := int(max(a.CachedTokens, 0) / bs)
	if want < 0 {
		return true // not one full block: the engine cached nothing of it
	}
	since := a.Sent.Add(-sentSlack)
	anchor := t.anchorLocked(a, first)
	var best uint64
	bestD, bestR := -1, rank{miss: 1 << 30}
	for i, scanned := t.n-1, 0; i >= 0 && scanned < maxScan; i, scanned = i-1, scanned+1 {
		st := t.order[(t.head+i)%len(t.order)]
		nd := t.nodes[st.h]
		if nd == nil || nd.serial != st.serial {
			continue
		}
		if nd.stored.Before(since) {
			break
		}
		if nd.owned {
			continue
		}
		d, ok := t.depthLocked(nd, first, since)
		if !ok {
			continue
		}
		miss := abs(d - want)
		if miss > 1 {
			if !late || d < promptLeaf || d > want {
				continue
			}
			miss = 2 + want - d // late: the deepest
		}
		if !t.startsAtLocked(st.h, d, first, since) {
			continue
		}
		r := rank{anchored: anchor != 0 && t.descendsLocked(st.h, d, anchor), leaf: t.leafLocked(st.h, nd), miss: miss}
		if !bestR.before(r) { // scanning back: ties go to the earlier
			best, bestD, bestR = st.h, d, r
		}
	}
	if bestD < 0 || anchor != 0 && !bestR.anchored && !late {
		return false
	}
	t.mapLocked(a, best, bestD, since)
	t.st.Attributed++
	return true
}

// depthLocked is a block's depth: known from its ancestors, or, when
// its chain starts at a block whose parent was never seen (stored
// before the subscription), inferred from the request's cached tokens
// (that top block is the first one the engine computed for it, so it
// must have been stored since the request was sent).
func (t *Tracker) depthLocked(nd *node, first int, since time.Time) (int, bool) {
	k := 0
	for ; nd.depth < 0 && k < t.cfg.MaxBlocks; k++ {
		p := t.nodes[nd.parent]
		if p == nil {
			if nd.stored.Before(since) {
				return 0, false
			}
			return first + k, true
		}
		nd = p
	}
	if nd.depth < 0 {
		return 0, false
	}
	return nd.depth + k, true
}

// rank orders the chains that may be an answer's: under its anchor
// first, then ending at a leaf (a block nothing was stored under: the
// request's own chain has no continuation until its next turn is sent,
// while a block inside another request's longer chain has one), then
// nearest the depth the usage names.
type rank struct {
	anchored, leaf bool
	miss           int
}

// before reports whether r ranks strictly before o.
func (r rank) before(o rank) bool {
	if r.anchored != o.anchored {
		return r.anchored
	}
	if r.leaf != o.leaf {
		return r.leaf
	}
	return r.miss < o.miss
}

// leafLocked reports whether no block known is stored under h.
func (t *Tracker) leafLocked(h uint64, nd *node) bool {
	for _, k := range nd.kids {
		if kd := t.nodes[k]; kd != nil && kd.parent == h {
			return false
		}
	}
	return true
}

// anchorLocked is the engine block that the deepest of a's text blocks
// lying wholly in the engine's cached prefix is mapped to; 0 when none
// is. The prefix ends a block above depth first: text blocks are placed
// by proportion, so one near the boundary may have been mapped a block
// deeper than where this answer's ratios put it.
func (t *Tracker) anchorLocked(a Answer, first int) uint64 {
	bs := float64(t.st.BlockSize)
	for i := len(a.Hashes) - 1; i >= 0; i-- {
		if (i+1)*a.BlockBytes > a.PromptBytes || textDepth(a, i, bs) >= first-1 {
			continue
		}
		if eh, ok := t.texts[a.Hashes[i]]; ok && t.nodes[eh] != nil {
			return eh
		}
	}
	return 0
}

// descendsLocked reports whether the chain ending at leaf (depth d)
// passes through engine block anchor.
func (t *Tracker) descendsLocked(leaf uint64, d int, anchor uint64) bool {
	h := leaf
	for range min(d+1, t.cfg.MaxBlocks) {
		if h == anchor {
			return true
		}
		nd := t.nodes[h]
		if nd == nil || !nd.hasParent {
			return false
		}
		h = nd.parent
	}
	return false
}

// startsAtLocked checks that the chain ending at leaf (depth d) has its
// block at depth first stored since the request was sent: that is the
// first block the engine computed for it. A chain whose block there is
// older is another request's.
func (t *Tracker) startsAtLocked(leaf uint64, d, first int, since time.Time) bool {
	if first > d {
		return false
	}
	h := leaf
	for range d - first {
		nd := t.nodes[h]
		if nd == nil || !nd.hasParent {
			return false
		}
		h = nd.parent
	}
	nd := t.nodes[h]
	return nd != nil && !nd.stored.Before(since)
}

// mapLocked maps a's text blocks onto the chain ending at leaf (depth
// d): text block i onto the block holding its last byte, read as a token
// position in proportion (the prompt's bytes to its tokens, the answer's
// to its own). A text block past the leaf maps onto the leaf (the engine
// caches full blocks only, so its tail is at most a block short); one
// above the chain's known top stays as it was.
func (t *Tracker) mapLocked(a Answer, leaf uint64, d int, since time.Time) {
	path := make([]uint64, d+1) // by depth; 0 where unknown
	h, ok := leaf, true
	for depth := d; depth >= 0 && ok; depth-- {
		nd := t.nodes[h]
		if nd == nil {
			break
		}
		path[depth] = h
		if !nd.stored.Before(since) {
			nd.owned = true
		}
		if nd.depth < 0 {
			nd.depth = depth
		}
		h, ok = nd.parent, nd.hasParent
	}
	bs := float64(t.st.BlockSize)
	for i, th := range a.Hashes {
		depth := min(textDepth(a, i, bs), d)
		if depth < 0 || path[depth] == 0 {
			continue
		}
		eh := path[depth]
		t.held = append(t.held, th)
		if t.texts[th] == eh {
			continue
		}
		t.texts[th] = eh
		nd := t.nodes[eh]
		nd.texts = t.compactLocked(eh, append(nd.texts, th))
	}
}

// compactLocked drops from a block's text list those mapped elsewhere
// since, once the list grows: a block holds the ends of a few text
// blocks at most.
func (t *Tracker) compactLocked(h uint64, texts []uint64) []uint64 {
	if len(texts) <= 8 {
		return texts
	}
	keep := texts[:0]
	for _, th := range texts {
		if t.texts[th] == h {
			keep = append(keep, th)
		}
	}
	return keep
}

// textDepth is the depth of the engine block holding text block i's last
// byte, read as a token position in proportion (the prompt's bytes to
// its tokens, the answer's to its own); bs is the engine's block size.
func textDepth(a Answer, i int, bs float64) int {
	p, g := float64(a.PromptTokens), float64(max(a.CompletionTokens, 0))
	end := float64((i + 1) * a.BlockBytes)
	tok := end * p / float64(a.PromptBytes)
	if end > float64(a.PromptBytes) {
		tok = p
		if ab := float64(a.TextBytes - a.PromptBytes); ab > 0 {
			tok += (end - float64(a.PromptBytes)) * g / ab
		}
	}
	return int(math.Ceil(tok/bs)) - 1
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
