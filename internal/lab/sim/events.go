package sim

import "container/heap"

// Event kinds.
const (
	evPrefillDone uint8 = iota // a: replica
	evDecodeDone               // a: replica, b: job
	evGossipTick               // every owner sends deltas and load
	evDeliver                  // a: recipient router, b: message
	evScrape                   // owners read their engines' counts
	evSMGSync                  // smg-mesh routers exchange their tree inserts
	evAdmitPoll                // a: router: its admission reads the room again
	evProbe                    // a: replica: its owner reads its engine's counts (probeSlots)
	evLoadTick                 // a: owner: it sends its replicas' load alone (loadTick)
)

// event is one scheduled happening in virtual time. seq breaks ties in
// scheduling order, which keeps runs deterministic.
type event struct {
	t    float64
	seq  uint64
	kind uint8
	a, b int32
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// queue is the simulator's clock: a heap of future events.
type queue struct {
	h   eventHeap
	seq uint64
}

func (q *queue) push(t float64, kind uint8, a, b int32) {
	q.seq++
	heap.Push(&q.h, event{t: t, seq: q.seq, kind: kind, a: a, b: b})
}

func (q *queue) empty() bool { return len(q.h) == 0 }

// peek returns the time of the next event; only valid when not empty.
func (q *queue) peek() float64 { return q.h[0].t }

func (q *queue) pop() event { return heap.Pop(&q.h).(event) }
