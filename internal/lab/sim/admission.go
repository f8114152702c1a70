package sim

import "github.com/kvmesh/kvmesh/proxy/admit"

// admission models the routers' admission (package proxy/admit,
// Config.AdmitMaxWaiting): each router holds a request in its own queue
// while no replica has room in its view, and routes the queue's oldest
// when a request it admitted ends or its poll finds room.
type admission struct {
	w       *world
	lim     admit.Limits
	held    [][]int32 // per router: requests waiting in its queue, oldest first
	polling []bool    // per router: a poll is scheduled
}

func newAdmission(w *world, maxWaiting int) *admission {
	return &admission{w: w, lim: admit.Limits{MaxWaiting: maxWaiting},
		held: make([][]int32, w.nR), polling: make([]bool, w.nR)}
}

// hold queues request i at its entry router k when something already
// waits there or the router's view gives it no room, as Admit does.
func (a *admission) hold(k int, i int32) bool {
	if len(a.held[k]) == 0 && a.hasRoom(k, &a.w.p.reqs[i]) {
		return false
	}
	a.held[k] = append(a.held[k], i)
	a.poll(k)
	return true
}

// hasRoom reports whether router k's view gives a request room to start
// now: some replica is open or has a place left (admit.RoomOf, and the
// dispatcher's test for a request of the only class).
func (a *admission) hasRoom(k int, r *simReq) bool {
	a.w.fillCandidates(k, r)
	room := admit.RoomOf(a.w.cands, a.lim)
	return room.Open || room.Free > 0
}

// next routes what fits of router k's queue, oldest first, as its
// dispatcher does on a request's end or its poll.
func (a *admission) next(k int) error {
	for len(a.held[k]) > 0 && a.hasRoom(k, &a.w.p.reqs[a.held[k][0]]) {
		i := a.held[k][0]
		a.held[k] = a.held[k][1:]
		if err := a.w.arrive(k, i); err != nil {
			return err
		}
	}
	if len(a.held[k]) > 0 {
		a.poll(k)
	}
	return nil
}

// poll schedules router k's next read of its room while requests wait,
// every admit.DefaultPoll as the dispatcher polls.
func (a *admission) poll(k int) {
	if !a.polling[k] {
		a.polling[k] = true
		a.w.q.push(a.w.now+ms(admit.DefaultPoll.Seconds()), evAdmitPoll, int32(k), 0)
	}
}

// waiting reports whether any router's queue holds a request: the
// owners keep scraping and gossiping until it is routed, as a router's
// loops run while it serves. False without admission.
func (a *admission) waiting() bool {
	if a == nil {
		return false
	}
	for _, h := range a.held {
		if len(h) > 0 {
			return true
		}
	}
	return false
}
