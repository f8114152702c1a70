package replicasim

import (
	"container/list"
	"sync"

	"github.com/kvmesh/kvmesh/internal/kvevents"
)

// prefixCache is the engine's KV block cache, modelled on vLLM's: a block is
// known by its chained hash; blocks held by running sequences (refs > 0) are
// pinned and cannot be evicted; blocks nobody holds sit in an LRU free list
// and are evicted oldest first when a new block needs room. Capacity counts
// both kinds.
type prefixCache struct {
	mu       sync.Mutex
	capacity int
	blocks   map[uint64]*cacheEntry
	free     list.List // of *cacheEntry, front = least recently used
	// publish, when set, is given the KV-cache events of each change, in
	// order, under mu (so batches are published in the order they
	// happened), as vLLM's publisher would send them.
	publish   func([]kvevents.Event)
	blockSize int
}

type cacheEntry struct {
	hash    uint64
	refs    int
	elem    *list.Element // in free while refs == 0, else nil
	dropped bool          // removed by reset while pinned; release ignores it
}

func newPrefixCache(capacity, blockSize int) *prefixCache {
	return &prefixCache{capacity: capacity, blockSize: blockSize, blocks: make(map[uint64]*cacheEntry)}
}

// matchAndAcquire pins the leading run of hashes that is cached and returns
// it (its length is the prefix match), in one step so that nothing evicts
// those blocks in between.
func (c *prefixCache) matchAndAcquire(hashes []uint64) []*cacheEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	var held []*cacheEntry
	for _, h := range hashes {
		e, ok := c.blocks[h]
		if !ok {
			break
		}
		c.pinLocked(e)
		held = append(held, e)
	}
	return held
}

// acquire pins every hash, inserting missing ones and evicting unpinned
// blocks for room. It stops at the first block it cannot place (all blocks
// pinned), since a chain with a hole is useless past it, and returns the
// blocks it pinned, for release.
func (c *prefixCache) acquire(hashes []uint64) []*cacheEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	held := make([]*cacheEntry, 0, len(hashes))
	var ev eventLog
	for i, h := range hashes {
		if e, ok := c.blocks[h]; ok {
			c.pinLocked(e)
			held = append(held, e)
			continue
		}
		if len(c.blocks) >= c.capacity {
			front := c.free.Front()
			if front == nil {
				break
			}
			victim := c.free.Remove(front).(*cacheEntry)
			delete(c.blocks, victim.hash)
			ev.removed(victim.hash)
		}
		e := &cacheEntry{hash: h, refs: 1}
		c.blocks[h] = e
		held = append(held, e)
		ev.stored(hashes, i, c.blockSize)
	}
	if c.publish != nil && len(ev.events) > 0 {
		c.publish(ev.events)
	}
	return held
}

// eventLog collects one change's events in order: runs of blocks stored
// (each a chain under its parent) and blocks removed.
type eventLog struct{ events []kvevents.Event }

func (l *eventLog) removed(h uint64) {
	if n := len(l.events); n > 0 && l.events[n-1].Kind == kvevents.BlockRemoved {
		l.events[n-1].Hashes = append(l.events[n-1].Hashes, h)
		return
	}
	l.events = append(l.events, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{h}, Medium: "GPU"})
}

// stored adds hashes[i], extending the last event when it stored
// hashes[i-1].
func (l *eventLog) stored(hashes []uint64, i, bs int) {
	if n := len(l.events); n > 0 && i > 0 {
		e := &l.events[n-1]
		if e.Kind == kvevents.BlockStored && e.Hashes[len(e.Hashes)-1] == hashes[i-1] {
			e.Hashes = append(e.Hashes, hashes[i])
			e.Tokens += bs
			return
		}
	}
	e := kvevents.Event{Kind: kvevents.BlockStored, Hashes: []uint64{hashes[i]}, BlockSize: bs, Tokens: bs, Medium: "GPU"}
	if i > 0 {
		e.Parent, e.HasParent = hashes[i-1], true
	}
	l.events = append(l.events, e)
}

func (c *prefixCache) pinLocked(e *cacheEntry) {
	if e.refs == 0 && e.elem != nil {
		c.free.Remove(e.elem)
		e.elem = nil
	}
	e.refs++
}

// release unpins hashes, last first, so that when they all become free the
// tail of a chain is evicted before its head (shared prefixes live longer),
// as vLLM does.
func (c *prefixCache) release(held []*cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(held) - 1; i >= 0; i-- {
		e := held[i]
		if e.dropped || e.refs == 0 {
			continue // a reset forgot it while held
		}
		e.refs--
		if e.refs == 0 {
			e.elem = c.free.PushBack(e)
		}
	}
}

// reset drops every block. Blocks pinned by running sequences are forgotten
// too: their sequences keep computing, but their blocks are not reused, which
// is what emptying vLLM's prefix cache means for later requests.
func (c *prefixCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.blocks {
		e.dropped = true
	}
	clear(c.blocks)
	c.free.Init()
	if c.publish != nil {
		c.publish([]kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
	}
}

// len returns the number of blocks held.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.blocks)
}
