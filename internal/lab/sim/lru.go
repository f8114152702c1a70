package sim

// lru is a replica's exact prefix cache: at most cap blocks keyed by trace
// block id, least recently used evicted first. Slots live in flat arrays
// with an intrusive doubly linked list, so every operation is O(1) per block
// and the cache allocates nothing after it fills.
type lru struct {
	cap   int
	slot  map[int64]int32
	key   []int64
	prev  []int32 // towards the most recent end
	next  []int32 // towards the least recent end
	head  int32   // most recent, -1 when empty
	tail  int32   // least recent, -1 when empty
	free  []int32
	count int
}

func newLRU(capacity int) *lru {
	return &lru{cap: capacity, slot: make(map[int64]int32, capacity+1), head: -1, tail: -1}
}

// has reports whether the block is cached, without refreshing it.
func (c *lru) has(id int64) bool {
	_, ok := c.slot[id]
	return ok
}

// leadingRun returns how many leading ids are cached: a KV prefix cache
// only reuses a prefix, so counting stops at the first miss.
func (c *lru) leadingRun(ids []int64) int {
	for i, id := range ids {
		if !c.has(id) {
			return i
		}
	}
	return len(ids)
}

// touchAll refreshes or inserts every id, last to first, so the request's
// head ends most recent and its tail is evicted first (as vLLM and SGLang
// do), then evicts down to capacity.
func (c *lru) touchAll(ids []int64) {
	for i := len(ids) - 1; i >= 0; i-- {
		c.touch(ids[i])
	}
}

// touchInOrder refreshes or inserts every id, first to last, so the
// request's tail ends most recent and its head is evicted first. This is
// what a router-side index gets when it adds a request's block hashes to
// a plain LRU in prompt order (llm-d's approximate prefix indexer does, on
// a hashicorp/golang-lru per server).
func (c *lru) touchInOrder(ids []int64) {
	for _, id := range ids {
		c.touch(id)
	}
}

func (c *lru) touch(id int64) {
	if s, ok := c.slot[id]; ok {
		c.unlink(s)
		c.pushFront(s)
		return
	}
	var s int32
	if n := len(c.free); n > 0 {
		s = c.free[n-1]
		c.free = c.free[:n-1]
		c.key[s] = id
	} else {
		s = int32(len(c.key))
		c.key = append(c.key, id)
		c.prev = append(c.prev, -1)
		c.next = append(c.next, -1)
	}
	c.slot[id] = s
	c.pushFront(s)
	c.count++
	for c.count > c.cap {
		t := c.tail
		c.unlink(t)
		delete(c.slot, c.key[t])
		c.free = append(c.free, t)
		c.count--
	}
}

func (c *lru) unlink(s int32) {
	p, n := c.prev[s], c.next[s]
	if p >= 0 {
		c.next[p] = n
	} else {
		c.head = n
	}
	if n >= 0 {
		c.prev[n] = p
	} else {
		c.tail = p
	}
	c.prev[s], c.next[s] = -1, -1
}

func (c *lru) pushFront(s int32) {
	c.prev[s] = -1
	c.next[s] = c.head
	if c.head >= 0 {
		c.prev[c.head] = s
	}
	c.head = s
	if c.tail < 0 {
		c.tail = s
	}
}
