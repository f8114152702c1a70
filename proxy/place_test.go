package proxy

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// Decisions computed on one view are caught up at commit with the
// placements committed since that view, each where it went (one more in
// flight, its prefill, one more own where this router decided it), and
// a collision on the chosen replica is reported so the decision is made
// again.
func TestPlaceBookCatchUp(t *testing.T) {
	cands := func() []route.Candidate {
		cs := make([]route.Candidate, 4)
		for i := range cs {
			cs[i].Detail = &route.Detail{ID: fmt.Sprintf("r%d", i)}
		}
		cs[3].Stale = true
		return cs
	}
	type placed struct {
		id     string
		blocks float64
		own    bool
	}
	for _, tc := range []struct {
		name     string
		before   []placed // committed before the view was read
		since    []placed // committed after
		chosen   string
		hit      bool
		inFlight []int32
		own      []int32
		pending  []float64
	}{
		{"nothing since", []placed{{"r0", 4, true}}, nil, "r0", false, []int32{0, 0, 0, 0}, []int32{0, 0, 0, 0}, []float64{0, 0, 0, 0}},
		{"an own placement on the chosen replica", nil, []placed{{"r1", 4, true}}, "r1", true,
			[]int32{0, 1, 0, 0}, []int32{0, 1, 0, 0}, []float64{0, 4, 0, 0}},
		{"elsewhere, and a forwarded one", []placed{{"r1", 4, true}}, []placed{{"r0", 4, true}, {"r2", 3, false}}, "r1", false,
			[]int32{1, 0, 1, 0}, []int32{1, 0, 0, 0}, []float64{4, 0, 3, 0}},
		{"a stale replica's load stays unknown", nil, []placed{{"r3", 4, true}}, "r3", false,
			[]int32{0, 0, 0, 0}, []int32{0, 0, 0, 0}, []float64{0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b placeBook
			b.mu.Lock()
			defer b.mu.Unlock()
			for _, p := range tc.before {
				b.recordLocked(p.id, p.blocks, p.own)
			}
			snap := b.seq.Load()
			for _, p := range tc.since {
				b.recordLocked(p.id, p.blocks, p.own)
			}
			cs := cands()
			if hit := b.catchUpLocked(cs, snap, tc.chosen); hit != tc.hit {
				t.Fatalf("hit %v, want %v", hit, tc.hit)
			}
			for i, c := range cs {
				if c.InFlight != tc.inFlight[i] || c.Detail.Own != tc.own[i] || c.PendingPrefillBlocks != tc.pending[i] {
					t.Fatalf("%s: in flight %d, own %d, pending %v; want %d, %d, %v", c.ID(), c.InFlight, c.Detail.Own,
						c.PendingPrefillBlocks, tc.inFlight[i], tc.own[i], tc.pending[i])
				}
			}
		})
	}
}

// More placements since a view than the log holds: the newest are caught
// up, no older entry is read twice or for another sequence.
func TestPlaceBookCatchUpWraps(t *testing.T) {
	var b placeBook
	cs := []route.Candidate{{Detail: &route.Detail{ID: "r0"}}}
	b.mu.Lock()
	defer b.mu.Unlock()
	for range placeLogLen + 10 {
		b.recordLocked("r0", 1, true)
	}
	if !b.catchUpLocked(cs, 0, "r0") || cs[0].InFlight != placeLogLen {
		t.Fatalf("caught up %d placements, want the %d the log holds", cs[0].InFlight, placeLogLen)
	}
}

// lockCheckView counts the proxy's Locate calls and those it makes while
// its placement lock is held (the mesh's Locate takes the mesh's lock,
// which gossip holds for writes).
type lockCheckView struct {
	*fakeView
	p                  atomic.Pointer[Proxy]
	locates, underLock atomic.Int32
}

func (v *lockCheckView) held() bool {
	p := v.p.Load()
	if p == nil || p.places.mu.TryLock() {
		if p != nil {
			p.places.mu.Unlock()
		}
		return false
	}
	return true
}

func (v *lockCheckView) Locate(id string) (string, bool, bool) {
	v.locates.Add(1)
	if v.held() {
		v.underLock.Add(1)
	}
	return v.fakeView.Locate(id)
}

// A decision books its request by the candidate's Local (the view's word
// on who owns the replica), asking the view nothing under the placement
// lock, and Locate runs once per decision (attempt's, for the owner's
// address): owned replicas are booked in the view (Begin), another
// router's in the hop book. At the owner a forwarded request keeps its
// own candidates by Local too: one Locate for its attempt.
func TestPlaceBookLocatesOnce(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "ok", 0) })
	far := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "hop", 0) })
	ownerView := &lockCheckView{fakeView: newFakeView([]string{"m"}, fakeReplica{id: far.URL},
		fakeReplica{id: "http://elsewhere", owner: "http://127.0.0.1:1"})}
	po, owner, _ := newTestProxy(t, ownerView, func(c *Config) { c.InsecureHops = true }) // unauthenticated hops: no dispatch 103
	ownerView.p.Store(po)
	view := &lockCheckView{fakeView: newFakeView([]string{"m"}, fakeReplica{id: rep.URL},
		fakeReplica{id: far.URL, owner: owner.URL})}
	p, srv, _ := newTestProxy(t, view, nil)
	view.p.Store(p)
	const n = 8
	for i := range n {
		resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, fmt.Sprintf("%d %s", i, longPrompt)))
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		// Ended before the next: each decision sees idle replicas, and
		// places by its key.
		waitCounted(t, p, epChat, i+1)
	}
	local, hops := rep.count(), far.count()
	waitCounted(t, po, epChat, hops)
	for _, c := range []struct {
		name      string
		v         *lockCheckView
		decisions int
	}{{"entry", view, n}, {"owner", ownerView, hops}} {
		if got := c.v.locates.Load(); got != int32(c.decisions) {
			t.Errorf("%s: %d Locate calls for %d decisions, want one each", c.name, got, c.decisions)
		}
		if got := c.v.underLock.Load(); got != 0 {
			t.Errorf("%s: %d Locate calls under the placement lock", c.name, got)
		}
	}
	view.mu.Lock()
	begins := view.begins[rep.URL]
	view.mu.Unlock()
	if local == 0 || hops == 0 || begins != local || local+hops != n {
		t.Errorf("%d requests at the owned replica (%d booked in the view), %d hops; want both used, each owned one booked",
			local, begins, hops)
	}
}

// TestPlaceBookReadIsExact: whatever commits land while a decision reads
// the loads, each placement counts once in what the decision sees: in
// the loads it read, or caught up from the sequence read returns. A
// commit that books between the loads and the sequence would be in
// neither if the sequence were read after the loads; read reads the
// loads again instead. Only commits in
// every read, placeReadTries times, leave it inexact.
func TestPlaceBookReadIsExact(t *testing.T) {
	for _, tc := range []struct {
		name   string
		during []string // per read of the loads, what a commit does after it: "" nothing, "commit", "begin", "end"
		reads  int
		exact  bool
	}{
		{"no commit", nil, 1, true},
		{"a commit after the loads were read", []string{"commit"}, 2, true},
		{"a commit booking when the read began, done during it", []string{"begin", "end"}, 3, true},
		{"a commit during every read", []string{"commit", "commit", "commit"}, placeReadTries, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b placeBook
			booked := 0 // the loads: what commits have booked
			commits := 0
			b.mu.Lock()
			defer b.mu.Unlock()
			begin := func() { b.gen.Add(1); booked++ }
			end := func() { b.recordLocked("r0", 1, true); b.gen.Add(1); commits++ }
			begin()
			end() // one before the decision
			seen, reads := 0, 0
			snap := b.read(func() {
				seen = booked
				if reads < len(tc.during) {
					switch tc.during[reads] {
					case "commit":
						begin()
						end()
					case "begin":
						begin()
					case "end":
						end()
					}
				}
				reads++
			})
			cs := []route.Candidate{{Detail: &route.Detail{ID: "r0"}}}
			b.catchUpLocked(cs, snap, "r0")
			if reads != tc.reads {
				t.Errorf("%d reads of the loads, want %d", reads, tc.reads)
			}
			if got := seen + int(cs[0].InFlight); (got == commits) != tc.exact {
				t.Errorf("%d placements seen (%d in the loads, %d caught up) of %d, want exact %v",
					got, seen, cs[0].InFlight, commits, tc.exact)
			}
		})
	}
}

// bookingView is a fakeView whose Begin counts in the candidates' in
// flight, as the mesh's does.
type bookingView struct{ *fakeView }

func (v bookingView) Begin(id string, prefill float64) (func(), func()) {
	v.add(id, 1)
	firstByte, done := v.fakeView.Begin(id, prefill)
	var once sync.Once
	return firstByte, func() {
		once.Do(func() { v.add(id, -1) })
		done()
	}
}

func (v bookingView) add(id string, n int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range v.replicas {
		if v.replicas[i].id == id {
			v.replicas[i].inFlight += n
		}
	}
}

// TestDecisionSeesACommitDuringItsRead: a request booked at a replica of
// one slot after another decision read the loads, and before that
// decision's placement sequence was checked (the hook), fills the
// replica for it: the decision reads the loads again, and the cold
// request goes to the other replica instead of queueing behind the one
// booked in the window.
func TestDecisionSeesACommitDuringItsRead(t *testing.T) {
	chat := func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "ok", 0) }
	reps := []*replicaServer{newReplica(t, chat), newReplica(t, chat)}
	view := bookingView{newFakeView([]string{"m"}, fakeReplica{id: reps[0].URL, slots: 1}, fakeReplica{id: reps[1].URL, slots: 1})}
	p, srv, _ := newTestProxy(t, view, nil)
	body := chatBody("m", false, longPrompt)
	served := func() []int { return []int{reps[0].count(), reps[1].count()} }
	// Where the prompt goes on idle replicas: its key's home.
	if resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	view.waitDone(t)
	home := 0
	if served()[1] == 1 {
		home = 1
	}
	var bk booking
	defer func() { bk.end() }()
	hooked := false
	p.loadsRead = func() {
		if hooked {
			return
		}
		hooked = true
		p.places.mu.Lock()
		bk, _ = p.bookLocked(reps[home].URL, true, 4, true)
		p.places.mu.Unlock()
	}
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", body)
	if b := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got := served(); got[1-home] != 1 || got[home] != 1 {
		t.Fatalf("served %v; want the second request at replica %d, the home %d being full", got, 1-home, home)
	}
}

// Detail.Written is the prefill blocks of this router's own placements
// in the log's window, per replica: forwarded requests (another router's
// decision) do not count, a placement leaving the window takes its blocks
// with it, and the decisions caught up at commit add theirs.
func TestPlaceBookWritten(t *testing.T) {
	var b placeBook
	cands := func() []route.Candidate {
		return []route.Candidate{{Detail: &route.Detail{ID: "r0"}}, {Detail: &route.Detail{ID: "r1"}}, {Detail: &route.Detail{ID: "r2"}}}
	}
	written := func() []float64 {
		cs := cands()
		b.fillWritten(cs)
		return []float64{cs[0].Detail.Written, cs[1].Detail.Written, cs[2].Detail.Written}
	}
	b.mu.Lock()
	b.recordLocked("r0", 30, true)
	b.recordLocked("r1", 5, true)
	b.recordLocked("r1", 100, false) // another router's decision: not this router's writing
	b.recordLocked("r0", 0, true)    // all cached: nothing written
	b.mu.Unlock()
	if got := written(); got[0] != 30 || got[1] != 5 || got[2] != 0 {
		t.Fatalf("written %v, want [30 5 0]", got)
	}
	// Fill the window with r2's placements: r0's and r1's leave it.
	b.mu.Lock()
	for range placeLogLen {
		b.recordLocked("r2", 2, true)
	}
	b.mu.Unlock()
	if got := written(); got[0] != 0 || got[1] != 0 || got[2] != 2*placeLogLen {
		t.Fatalf("after a full window of r2: written %v, want [0 0 %d]", got, 2*placeLogLen)
	}
	if len(b.written) != 1 {
		t.Fatalf("%d replicas kept, want only r2's", len(b.written))
	}
	// A decision whose view predates a placement catches it up.
	cs := cands()
	snap := b.seq.Load()
	b.mu.Lock()
	b.recordLocked("r1", 7, true)
	b.catchUpLocked(cs, snap, "r0")
	b.mu.Unlock()
	if cs[1].Detail.Written != 7 {
		t.Fatalf("caught-up written %v, want 7", cs[1].Detail.Written)
	}
}

// TestShortPromptsSpread: prompts shorter than one block have no block
// hash; each is keyed by its whole text (route.Request.Whole), so
// distinct short prompts spread over the replicas by rendezvous hashing
// instead of all sharing the model's key, and identical ones meet.
func TestShortPromptsSpread(t *testing.T) {
	const nrep, distinct = 8, 64
	reps := make([]*replicaServer, nrep)
	frs := make([]fakeReplica, nrep)
	for i := range reps {
		reps[i] = newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "ok", 0) })
		frs[i] = fakeReplica{id: reps[i].URL}
	}
	view := newFakeView([]string{"m"}, frs...)
	// 1 KiB blocks: every prompt here is shorter than one.
	_, srv, _ := newTestProxy(t, view, func(c *Config) { c.Contract = summary.DefaultContract() })
	send := func(text string) int {
		t.Helper()
		before := make([]int, nrep)
		for i, r := range reps {
			before[i] = r.count()
		}
		resp := post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("m", false, text))
		if readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		view.waitDone(t)
		for i, r := range reps {
			if r.count() != before[i] {
				return i
			}
		}
		t.Fatal("no replica got the request")
		return -1
	}
	used := map[int]int{}
	for i := range distinct {
		used[send(fmt.Sprintf("short question %d?", i))]++
	}
	// 64 keys over 8 replicas by rendezvous: the replicas' IDs carry
	// ports picked at random, so the weights differ from run to run, and
	// one replica gets none in about one run of 600 (8×(7/8)^64); three
	// get none in fewer than one of 10^9.
	if len(used) < nrep-2 {
		t.Errorf("%d distinct short prompts used %d of %d replicas: %v", distinct, len(used), nrep, used)
	}
	for _, n := range used {
		if n > distinct/2 {
			t.Errorf("one replica took %d of %d distinct short prompts: %v", n, distinct, used)
		}
	}
	first := send("the same short prompt")
	for range 7 {
		if got := send("the same short prompt"); got != first {
			t.Fatalf("an identical short prompt went to replica %d, then %d", first, got)
		}
	}
}
