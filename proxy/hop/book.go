package hop

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/route/hopload"
)

// Clock tells when a remote replica's load was last heard from its
// owner (the mesh's LoadHeard).
type Clock interface {
	LoadHeard(replicaID string) (at time.Time, ok bool)
}

// Book keeps the requests this router forwarded to replicas other
// routers own, until they end. A remote candidate's load is its owner's
// last state, up to a gossip tick old: a second request this router
// places within that tick would see the replica as idle as the first did,
// and two cold requests of one router land on one replica while another
// is free (three routers then placed worse than one). So the requests
// this router sent there after that state are added to it by hopload's
// rule, the simulator's too. It is safe for concurrent use.
type Book struct {
	mu    sync.Mutex
	marks map[string][]*Mark // remote replica ID -> requests in flight
	now   func() time.Time
}

// Mark is one request forwarded to a remote replica.
type Mark struct {
	id        string // the replica: the hinted one, or where its owner sent it (move)
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

// maxReplicas bounds the replicas the book keeps marks for: their IDs
// come from the mesh.
const maxReplicas = 1 << 12

// NewBook returns an empty book.
func NewBook() *Book {
	return &Book{marks: map[string][]*Mark{}, now: time.Now}
}

// Send marks a request forwarded now to remote replica id, bringing
// blocks of prefill, and returns the functions that end its prefill (at
// the first byte) and the request. Both are idempotent.
func (b *Book) Send(id string, blocks float64) (firstByte, done func()) {
	_, firstByte, done = b.SendMark(id, blocks)
	return firstByte, done
}

// SendMark is send that also returns the mark (nil when the book is
// full), for move.
func (b *Book) SendMark(id string, blocks float64) (mark *Mark, firstByte, done func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, ok := b.marks[id]
	if !ok && len(b.marks) >= maxReplicas {
		return nil, func() {}, func() {}
	}
	m := &Mark{id: id, at: b.now(), blocks: max(blocks, 0)}
	b.marks[id] = append(q, m)
	var once sync.Once
	return m, func() {
			b.mu.Lock()
			m.prefilled = true
			b.mu.Unlock()
		}, func() {
			once.Do(func() {
				b.mu.Lock()
				defer b.mu.Unlock()
				m.ended = true
				b.dropLocked(m)
			})
		}
}

// dropLocked takes m out of its replica's marks.
func (b *Book) dropLocked(m *Mark) {
	q := b.marks[m.id][:0]
	for _, x := range b.marks[m.id] {
		if x != m {
			q = append(q, x)
		}
	}
	if len(q) == 0 {
		delete(b.marks, m.id)
	} else {
		b.marks[m.id] = q
	}
}

// Move books mark m on replica to: the owner sent the request there
// rather than to the replica this router chose (it decides again among
// its own replicas when the hint can no longer start the request, and
// names the replica in its dispatch 103). The simulator's routers count
// their requests where they run (internal/lab/sim, ownLoad); without this the
// request would count at the hinted replica, which does not have it,
// until it ended.
func (b *Book) Move(m *Mark, to string) {
	if m == nil || to == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if m.ended || m.id == to {
		return
	}
	q, ok := b.marks[to]
	if !ok && len(b.marks) >= maxReplicas {
		return
	}
	b.dropLocked(m)
	m.id = to
	// Keep dispatch order (fill walks back from the newest).
	i := len(q)
	for i > 0 && q[i-1].at.After(m.at) {
		i--
	}
	b.marks[to] = slices.Insert(q, i, m)
}

// Fill adds to each remote candidate the requests this router sent it
// after its owner's load was heard: one more in flight each, and their
// prefill while it is pending. It sets Own, this router's requests in
// flight there, whatever the clock. cands are sorted by ID
// (View.Candidates).
//
// The clock is read without b.mu: LoadHeard takes the mesh's lock, which
// gossip holds for writes, and a decision's commit takes b.mu (SendMark)
// under the proxy's placement lock (proxy/place.go), which must not wait
// for gossip through a Fill holding b.mu. So Fill notes under b.mu the candidates
// whose owners it must ask, asks them, and counts under b.mu again; a
// request that ends in between is not counted, one sent in between is
// (it is after the owner's word either way).
func (b *Book) Fill(cands []route.Candidate, clock Clock) {
	var buf [8]heardAt
	ask := buf[:0]
	b.mu.Lock()
	for id, q := range b.marks {
		i := sort.Search(len(cands), func(i int) bool { return cands[i].ID() >= id })
		if i == len(cands) || cands[i].ID() != id {
			continue
		}
		cands[i].Detail.Own = route.Count32(len(q)) // a matching ID has a Detail
		if clock == nil || !q[len(q)-1].at.After(b.now().Add(-hopMarkFresh)) || cands[i].Stale {
			// No clock, nothing sent there lately (the owner has said it
			// all), or a stale candidate, whose load is unknown, not
			// counted.
			continue
		}
		ask = append(ask, heardAt{i: i})
	}
	b.mu.Unlock()
	if len(ask) == 0 {
		return
	}
	n := 0
	for _, a := range ask {
		if at, ok := clock.LoadHeard(cands[a.i].ID()); ok {
			ask[n] = heardAt{i: a.i, at: at}
			n++
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, a := range ask[:n] {
		c := &cands[a.i]
		l := hopload.Add(hopload.Load{InFlight: int(c.InFlight), Pending: c.PendingPrefillBlocks}, a.at, b.marks[c.ID()], sentOf)
		c.InFlight, c.PendingPrefillBlocks = route.Count32(l.InFlight), l.Pending
	}
}

// sentOf is m as hopload counts it.
func sentOf(m *Mark) hopload.Sent[time.Time] {
	return hopload.Sent[time.Time]{At: m.at, Blocks: m.blocks, Prefilled: m.prefilled}
}

// heardAt is a candidate (its index) whose owner's load was heard at at.
type heardAt struct {
	i  int
	at time.Time
}

// InFlight counts the requests in flight to remote replica id.
func (b *Book) InFlight(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.marks[id])
}
