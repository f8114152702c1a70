package sim

// lateBinding models an owner that keeps the queues of its replicas
// itself (Config.LateBind; the router's --late-bind, proxy/latebind.go): when
// the replica a request was decided for cannot start it (its known slots
// all taken), the owner holds the request, counted in flight at that
// replica so that every view still sees the load, instead of sending it
// to wait in that engine's queue. Whenever a request at one of its
// replicas ends, the owner decides its held requests again, oldest
// first, among its own replicas, and sends each whose new choice can
// start it; one whose choice is still full waits on, now for that one.
// Why: with heavy-tailed answers an engine's queue waits behind the one
// long answer at its head, while another replica's slot frees first; a
// queue kept at the owner goes to the first slot that frees among all
// its replicas (an M/G/k queue instead of k queues of M/G/1), where the
// decision, made again, still weighs the cache a move gives up.
type lateBinding struct {
	w      *world
	heldAt []int        // per replica: held requests counted in flight there
	q      [][]lateHeld // per owner: held requests, oldest first
}

// lateHeld is a held request and the decision it waits on.
type lateHeld struct {
	i, entry, j int32 // request, entry router, replica it is counted at
	est         float64
	best        int32
}

func newLateBinding(w *world) *lateBinding {
	return &lateBinding{w: w, heldAt: make([]int, len(w.rep)), q: make([][]lateHeld, w.nR)}
}

// full reports whether replica j's engine, as its owner counts it, has
// every known slot taken by requests sent to it (not those held). A
// count learnt from the queue is a floor (the router's
// lateBinder.engineFull): while the last scrape showed nothing waiting,
// one request more goes to the engine.
func (lb *lateBinding) full(j int) bool {
	e := lb.w.ownerEng(j)
	room := e.slots
	if !lb.w.p.cfg.SlotsPublished && e.waiting == 0 {
		room++
	}
	return e.slots > 0 && lb.w.rep[j].inFlight-lb.heldAt[j] >= room
}

// hold keeps h at the owner of its replica, counted in flight there.
func (lb *lateBinding) hold(h lateHeld) {
	lb.count(h, 1)
	o := lb.w.owner(int(h.j))
	lb.q[o] = append(lb.q[o], h)
}

func (lb *lateBinding) count(h lateHeld, n int) {
	rep := lb.w.rep[h.j]
	rep.inFlight += n
	rep.pending += float64(n) * h.est
	lb.heldAt[h.j] += n
	loadChanged(lb.w, int(h.j))
}

// pools reports whether owner o owns more than one replica: an owner of
// one would hold a queue that is its engine's again, for nothing (the
// router's bindLate skips it too).
func (lb *lateBinding) pools(o int) bool {
	return o+lb.w.nR < len(lb.w.rep)
}

// room reports whether some replica owner o owns could start a request.
func (lb *lateBinding) room(o int) bool {
	for j := o; j < len(lb.w.rep); j += lb.w.nR {
		if !lb.full(j) {
			return true
		}
	}
	return false
}

// release decides owner o's held requests again, oldest first, while
// one of its replicas could start a request.
func (lb *lateBinding) release(o int) {
	w := lb.w
	q := lb.q[o]
	kept := q[:0]
	for n, h := range q {
		if !lb.room(o) {
			kept = append(kept, q[n:]...)
			break
		}
		lb.count(h, -1)
		r := &w.p.reqs[h.i]
		w.fillCandidates(o, r)
		own := w.ownCands[:0]
		for j := o; j < len(w.cands); j += w.nR {
			own = append(own, w.cands[j])
		}
		w.ownCands = own
		d := w.p.cfg.Route.Pick(r.req, own)
		h.j, h.est = int32(o+d.Index*w.nR), float64(len(r.ids)-d.Match)
		if lb.full(int(h.j)) {
			lb.count(h, 1)
			kept = append(kept, h)
			continue
		}
		w.retrace(int(h.j), r)
		w.dispatch(int(h.entry), int(h.j), h.i, h.est)
		w.jobs[h.i].best = h.best
	}
	lb.q[o] = kept
}
