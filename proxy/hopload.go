package proxy

import (
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/route"
)

// loadClock is what the proxy needs of a view to count its own requests
// into another router's replica's load: when that load was last heard.
// The mesh implements it; a view without it gets no correction.
type loadClock interface {
	LoadHeard(replicaID string) (at time.Time, ok bool)
}

// hopBook keeps the requests this router forwarded to replicas other
// routers own, until they end. A remote candidate's load is its owner's
// last state, up to a gossip tick old: a second request this router
// places within that tick would see the replica as idle as the first did,
// and two cold requests of one router land on one replica while another
// is free (three routers then placed worse than one). So the requests
// this router sent there after that state are added to it, as the
// simulator's routers do (internal/sim, ownLoad). It is safe for
// concurrent use.
type hopBook struct {
	mu    sync.Mutex
	marks map[string][]*hopMark // remote replica ID -> requests in flight
	now   func() time.Time
}

// hopMark is one request forwarded to a remote replica.
type hopMark struct {
	at        time.Time
	blocks    float64 // prefill the request brings (blocks the replica lacks)
	prefilled bool    // the first byte came back: its prefill is done
	ended     bool
}

// hopMarkFresh bounds how long after it was sent a request can be missing
// from its owner's state: an owner sends a full state within a gossip tick
// of any load change (a fraction of a second in every profile), and one
// silent for longer is stale (its load not counted at all). It lets a
// decision skip the replicas this router sent nothing to lately without
// asking the view.
const hopMarkFresh = 5 * time.Second

func newHopBook() *hopBook {
	return &hopBook{marks: map[string][]*hopMark{}, now: time.Now}
}

// send marks a request forwarded now to remote replica id, bringing
// blocks of prefill, and returns the functions that end its prefill (at
// the first byte) and the request. Both are idempotent.
func (b *hopBook) send(id string, blocks float64) (firstByte, done func()) {
	_, firstByte, done = b.sendAt(id, blocks)
	return firstByte, done
}

// sendAt is send that also returns the mark's time: loads the owner
// reports on the hop's dispatch 103 include this request and every one
// sent before it (hearLoads).
func (b *hopBook) sendAt(id string, blocks float64) (at time.Time, firstByte, done func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	at = b.now()
	q, ok := b.marks[id]
	if !ok && len(b.marks) >= maxSeqReplicas {
		return at, func() {}, func() {}
	}
	m := &hopMark{at: at, blocks: max(blocks, 0)}
	b.marks[id] = append(q, m)
	var once sync.Once
	return at, func() {
			b.mu.Lock()
			m.prefilled = true
			b.mu.Unlock()
		}, func() {
			once.Do(func() {
				b.mu.Lock()
				defer b.mu.Unlock()
				m.ended = true
				q := b.marks[id][:0]
				for _, x := range b.marks[id] {
					if !x.ended {
						q = append(q, x)
					}
				}
				if len(q) == 0 {
					delete(b.marks, id)
				} else {
					b.marks[id] = q
				}
			})
		}
}

// fill adds to each remote candidate the requests this router sent it
// after its owner's load was heard: one more in flight each, and their
// prefill while it is pending. cands are sorted by ID (View.Candidates).
func (b *hopBook) fill(cands []route.Candidate, clock loadClock) {
	if clock == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, q := range b.marks {
		if !q[len(q)-1].at.After(b.now().Add(-hopMarkFresh)) {
			continue // nothing sent there lately: the owner has said it all
		}
		i := sort.Search(len(cands), func(i int) bool { return cands[i].ID >= id })
		if i == len(cands) || cands[i].ID != id || cands[i].Stale {
			continue // a stale candidate's load is unknown, not counted
		}
		heard, ok := clock.LoadHeard(id)
		if !ok {
			continue
		}
		c := &cands[i]
		// Marks are in dispatch order: walk back from the newest to the
		// owner's last word, so a decision costs the requests sent since,
		// not all those in flight (long streams).
		for j := len(q) - 1; j >= 0 && q[j].at.After(heard); j-- {
			c.InFlight++
			if !q[j].prefilled {
				c.PendingPrefillBlocks += q[j].blocks
			}
		}
	}
}

// inFlight counts the requests in flight to remote replica id (tests).
func (b *hopBook) inFlight(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.marks[id])
}

// loadHearer is what the proxy needs of a view to apply the loads an
// owner reports on a hop's dispatch 103 (the mesh implements it): the
// load of replica id as its owner counted it at, fresher than its last
// gossiped state.
type loadHearer interface {
	HearLoad(id string, c route.Candidate, at time.Time)
}

// HeaderLoad rides on the owner's dispatch 103: the load of each replica
// it owns that could take the request, as it decided, the dispatched
// request included. One entry per replica, comma-separated: the replica
// ID (query-escaped), in flight, pending prefill blocks, running,
// waiting and slots, space-separated. Three routers that place one burst
// of requests on one snapshot of each other's replicas otherwise stack
// them up until the next gossip tick; with it an entry sees an owner's
// replicas as the owner does after each request it sent there.
const HeaderLoad = "X-Kvmesh-Load"

// appendLoads encodes cands (the owner's own candidates) for HeaderLoad,
// counting the request being dispatched to id with its blocks of prefill.
func appendLoads(dst []byte, cands []route.Candidate, id string, blocks float64) []byte {
	for i := range cands {
		c := &cands[i]
		inFlight, pending := c.InFlight, c.PendingPrefillBlocks
		if c.ID == id {
			inFlight++
			pending += max(blocks, 0)
		}
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, url.QueryEscape(c.ID)...)
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, int64(inFlight), 10)
		dst = append(dst, ' ')
		dst = strconv.AppendFloat(dst, pending, 'g', 6, 64)
		for _, v := range [...]int{c.Running, c.Waiting, c.Slots} {
			dst = append(dst, ' ')
			dst = strconv.AppendInt(dst, int64(v), 10)
		}
	}
	return dst
}

// maxLoadEntries bounds what an entry parses of one HeaderLoad.
const maxLoadEntries = maxSeqReplicas

// hearLoads applies an owner's HeaderLoad, as of at (the hop's mark: the
// owner's counts include it and the requests this router sent before).
// Malformed entries are skipped.
func hearLoads(h loadHearer, v string, at time.Time) {
	for n := 0; v != "" && n < maxLoadEntries; n++ {
		var e string
		e, v, _ = strings.Cut(v, ",")
		f := strings.Fields(e)
		if len(f) != 6 {
			continue
		}
		id, err := url.QueryUnescape(f[0])
		if err != nil || id == "" {
			continue
		}
		var c route.Candidate
		var nums [4]int
		ok := true
		for i, s := range [...]string{f[1], f[3], f[4], f[5]} {
			x, err := strconv.Atoi(s)
			if err != nil || x < 0 || x > 1<<30 {
				ok = false
				break
			}
			nums[i] = x
		}
		pending, err := strconv.ParseFloat(f[2], 64)
		if !ok || err != nil || !(pending >= 0 && pending < 1e12) {
			continue
		}
		c.ID, c.InFlight, c.PendingPrefillBlocks = id, nums[0], pending
		c.Running, c.Waiting, c.Slots = nums[1], nums[2], nums[3]
		h.HearLoad(id, c, at)
	}
}
