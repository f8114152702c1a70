package hop

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// A hop waits on its owner router (doc.go). When the owner is partitioned
// away, stopped or its host died, nothing on the hop's own connection
// says so: the entry waited for the dispatch timeout before the 103 (and
// then retried), but after it for the response-header timeout (ten
// minutes: a non-streamed generation sends its headers when it is done)
// and, mid-stream, for the upstream idle timeout, while the mesh had
// taken the owner for gone within seconds. So the entry keeps its hops in
// flight by owner (Owners) and, when the mesh tells it a router is
// gone, ends the hops that router can no longer answer:
//
//   - The mesh's word (memberlist's leave event) is not enough: it does
//     not tell a graceful leave (the router is draining its requests in
//     flight, and will finish them) from a failure, and a failure
//     detector can be wrong (its probes are UDP; the hop is a TCP
//     stream that may still flow). So the entry asks the owner itself,
//     once per event and only when it has hops there: GET /healthz with
//     a bound of ownerProbeTimeout. An answer (any status) or a refused
//     or reset connection (a host that is there, whose router closed its
//     listener to drain or restart: a dead process's connections were
//     reset with it) leaves the hops alone. Silence (a timeout, an
//     unreachable host or network, an unresolvable name) ends them.
//   - A hop the owner provably has not dispatched (no 103 on a
//     connection known to carry it) is left to the dispatch timeout,
//     which retries it: ending it sooner would retry it while the owner
//     may still dispatch it (its dispatch deadline, HeaderDispatchBy, is
//     what keeps a timed-out hop from running twice).
//   - A hop that may be running (the 103 came, or the owner does not
//     announce dispatches) and has no response headers yet is ended, and
//     its client answered at once: 502 with the error code
//     CodeOwnerGone. Not retried by the router: the generation may be
//     running at the replica. 502, not 503: a 503 from kvmesh means "not
//     processed, safe to retry elsewhere" (an owner's refusal past its
//     dispatch deadline, proxy/retry.go's rule), and this one may have been;
//     not 504, which says a timeout ran out, where the router knows the
//     owner is gone. A client may retry (the mesh routes around the lost
//     owner at once), knowing it may pay for a second generation.
//   - A hop already relaying a response is ended through relay's
//     mid-stream failure path, as an upstream that broke mid-stream.
//   - A router only suspected is not gone: the mesh says nothing, and
//     hops wait. Suspicion is memberlist's first missed probe, which a
//     loaded or lossy network shows often, and acting on it would cut
//     healthy streams for nothing.
//
// Events are fanned out by the mesh (no polling per hop); the probe runs
// on a goroutine of Owners, one per owner at a time, which Close ends.
// The registry holds a hop from its send to the end of its attempt.

// CodeOwnerGone is the error code of a request whose owner router was
// lost after it may have dispatched the request.
const CodeOwnerGone = "owner_router_gone"

// errOwnerGone ends a hop whose owner the mesh took for gone and which
// did not answer.
var errOwnerGone = errors.New("the mesh took the owner router for gone and it did not answer")

// ownerProbeTimeout bounds the probe of an owner the mesh took for gone.
// A router answers /healthz without a replica or a lock of the request
// path (the fault suite asserts 100 ms under floods); the bound lets one
// lost segment of the TCP handshake be sent again (RFC 6298's initial
// retransmission timeout is one second), so that a lossy but live path is
// not taken for a dead one.
const ownerProbeTimeout = 2 * time.Second

// Phase is how far a hop got, as the entry saw it.
type Phase uint8

const (
	// PhaseUnsent: no dispatch 103 and no byte, on a connection known to
	// carry the 103 (or none yet): provably not dispatched.
	PhaseUnsent Phase = iota
	// PhaseMaybe: no 103, but the owner is not known to announce
	// dispatches (or answered something else): may be running.
	PhaseMaybe
	// PhaseDispatched: the 103 came; no response headers yet.
	PhaseDispatched
	// PhaseRelaying: the response headers came; its body is relayed.
	PhaseRelaying
)

// Check is what the probe of an owner found.
type Check uint8

const (
	// Answered: it answered (any status): alive and reachable.
	Answered Check = iota
	// Refused: its host refused or reset the connection: the router
	// closed its listener (draining, restarting) or is dead, whose
	// connections were reset with it. Nothing to end.
	Refused
	// Silent: no answer within the bound, or no way to it.
	Silent
)

// hopAction is what an owner's loss does to one of its hops.
type hopAction uint8

const (
	// hopLeave: nothing; the hop runs on under its own timeouts.
	hopLeave hopAction = iota
	// hopAnswer: end it; its client gets 502 CodeOwnerGone.
	hopAnswer
	// hopCut: end the relay (the mid-stream failure path).
	hopCut
)

// goneAction is the rule: what the probe of a gone owner, a hop's phase
// and whether the owner spoke on the hop since the event make of the hop.
// An owner that sent the hop a byte after the mesh took it for gone is
// alive and reachable on that path, whatever the probe met (a lossy
// network can lose it, a failure detector can be wrong).
func goneAction(check Check, ph Phase, spoke bool) hopAction {
	if check != Silent || spoke {
		return hopLeave
	}
	switch ph {
	case PhaseMaybe, PhaseDispatched:
		return hopAnswer
	case PhaseRelaying:
		return hopCut
	}
	return hopLeave // PhaseUnsent: the dispatch timeout retries it
}

// checkOf classifies the probe's outcome (err from http.Client.Do).
func checkOf(err error) Check {
	switch {
	case err == nil:
		return Answered
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return Refused
	}
	return Silent
}

// Live is one hop in flight, in its owner's set.
type Live struct {
	owner    string
	watch    *Watch // nil when the dispatch protocol's side is off
	end      context.CancelCauseFunc
	relaying atomic.Bool
	ended    atomic.Uint32 // the hopAction that ended it (hopLeave: none)
	// heard is when the owner last sent the hop a byte of its response
	// (its headers, or a read of its body), as time since base (0:
	// never): monotonic, unlike a wall clock.
	heard atomic.Int64
	base  time.Time
}

// Relaying records that the hop's response headers came: its relay is
// under way.
func (h *Live) Relaying() { h.relaying.Store(true) }

// Owner is the API base URL of the hop's owner router.
func (h *Live) Owner() string { return h.owner }

// WrapBody returns body, whose bytes are the owner speaking.
func (h *Live) WrapBody(body io.ReadCloser) io.ReadCloser { return &liveBody{ReadCloser: body, h: h} }

// Spoke records that the owner sent the hop something now.
func (h *Live) Spoke() { h.heard.Store(int64(time.Since(h.base))) }

// liveBody is a hop's response body, which stamps the hop as its owner's
// bytes arrive.
type liveBody struct {
	io.ReadCloser
	h *Live
}

func (b *liveBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.h.Spoke()
	}
	return n, err
}

// phase is how far the hop got.
func (h *Live) phase() Phase {
	if h.relaying.Load() {
		return PhaseRelaying
	}
	if h.watch == nil {
		return PhaseMaybe
	}
	return h.watch.phase()
}

// Gone reports whether the hop was ended for its owner's loss; nil-safe.
func (h *Live) Gone() bool {
	return h != nil && hopAction(h.ended.Load()) != hopLeave
}

// Owners is the entry's hops in flight by owner API. It is safe for
// concurrent use.
type Owners struct {
	mu      sync.Mutex
	base    time.Time // the origin of the hops' heard stamps
	hops    map[string]map[*Live]struct{}
	probing map[string]bool
	closed  bool
	probe   Prober
	count   func(end string) // the metric, by outcome
	log     hclog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// Outcomes of the hops of a gone owner (kvmesh_hops_owner_gone_total's
// end label).
const (
	GoneError = "error" // answered 502 CodeOwnerGone
	GoneCut   = "cut"   // its relay was ended
	GoneKept  = "kept"  // the owner answered or refused the probe, or spoke on the hop since
	GoneLeft  = "left"  // not dispatched: left to the dispatch timeout
)

// Prober asks a router the mesh lost whether it still answers.
type Prober func(ctx context.Context, api string) (Check, error)

// ProbeHealthz is the Prober that asks GET /healthz through client.
func ProbeHealthz(client *http.Client) Prober {
	return func(ctx context.Context, api string) (Check, error) { return probe(ctx, client, api) }
}

// NewOwners returns the registry of hops in flight by owner. probe asks a
// lost owner whether it answers; count counts each hop's outcome by its
// label (GoneError...).
func NewOwners(probe Prober, count func(end string), log hclog.Logger) *Owners {
	ctx, cancel := context.WithCancel(context.Background())
	return &Owners{base: time.Now(), hops: map[string]map[*Live]struct{}{}, probing: map[string]bool{},
		probe: probe, count: count, log: log, ctx: ctx, cancel: cancel}
}

// Add registers a hop to owner; end cancels its request.
func (o *Owners) Add(owner string, watch *Watch, end context.CancelCauseFunc) *Live {
	h := &Live{owner: owner, watch: watch, end: end, base: o.base}
	o.mu.Lock()
	set := o.hops[owner]
	if set == nil {
		set = map[*Live]struct{}{}
		o.hops[owner] = set
	}
	set[h] = struct{}{}
	o.mu.Unlock()
	return h
}

// Remove unregisters a hop whose attempt ended.
func (o *Owners) Remove(h *Live) {
	o.mu.Lock()
	set := o.hops[h.owner]
	delete(set, h)
	if len(set) == 0 {
		delete(o.hops, h.owner)
	}
	o.mu.Unlock()
	if h.Gone() && h.relaying.Load() {
		o.count(GoneCut) // ended while relaying (cut, or answered as its headers came)
	}
}

// Gone is the mesh's event (Peers.WatchGone): when this router has hops to
// the owner, it probes it, and judges the hops in flight now. Hops sent
// later went to a router the view took for alive again (it came back, a
// new process at that address, perhaps), which the probe of the one gone
// does not describe: they are left to their timeouts. It never blocks.
func (o *Owners) Gone(api string) {
	o.mu.Lock()
	if o.closed || o.probing[api] || len(o.hops[api]) == 0 {
		o.mu.Unlock()
		return
	}
	hops := make([]*Live, 0, len(o.hops[api]))
	for h := range o.hops[api] {
		hops = append(hops, h)
	}
	o.probing[api] = true
	o.wg.Add(1)
	o.mu.Unlock()
	go o.check(api, hops, int64(time.Since(o.base)))
}

// check probes a gone owner and ends those of hops, still in flight,
// that it cannot answer and that it sent nothing since the event (at,
// as time since base).
func (o *Owners) check(api string, hops []*Live, at int64) {
	defer o.wg.Done()
	res, err := o.probe(o.ctx, api)
	o.mu.Lock()
	delete(o.probing, api)
	if o.ctx.Err() != nil {
		o.mu.Unlock()
		return
	}
	live := hops[:0]
	for _, h := range hops {
		if _, ok := o.hops[api][h]; ok {
			live = append(live, h)
		}
	}
	hops = live
	o.mu.Unlock()
	ended := 0
	for _, h := range hops {
		spoke := h.heard.Load() > at
		switch a := goneAction(res, h.phase(), spoke); a {
		case hopLeave:
			if res == Silent && !spoke {
				o.count(GoneLeft)
			} else {
				o.count(GoneKept)
			}
		default:
			h.ended.Store(uint32(a))
			h.end(errOwnerGone)
			ended++
		}
	}
	if res == Silent {
		o.log.Warn("owner router gone from the mesh and silent: ended its hops in flight that may be running", "owner", api,
			"hops", len(hops), "ended", ended, "probe", err)
	} else {
		o.log.Info("owner router gone from the mesh but reachable (leaving, or a wrong verdict): its hops run on", "owner", api,
			"hops", len(hops), "probe", err)
	}
}

// Stamp is the registry's clock now, for HeardSince.
func (o *Owners) Stamp() int64 { return int64(time.Since(o.base)) }

// HeardSince reports whether a hop to owner heard from it after stamp at.
func (o *Owners) HeardSince(owner string, at int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for h := range o.hops[owner] {
		if h.heard.Load() > at {
			return true
		}
	}
	return false
}

// HasPhase reports whether a hop to owner is in phase ph.
func (o *Owners) HasPhase(owner string, ph Phase) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for h := range o.hops[owner] {
		if h.phase() == ph {
			return true
		}
	}
	return false
}

// Close ends the probes in progress and waits for them; later events are
// ignored.
func (o *Owners) Close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.cancel()
	o.wg.Wait()
}

// probe asks a gone owner for /healthz within ownerProbeTimeout; the
// error, if any, is for the log.
func probe(ctx context.Context, client *http.Client, api string) (Check, error) {
	ctx, cancel := context.WithTimeout(ctx, ownerProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(api, "/")+"/healthz", nil)
	if err != nil {
		return Silent, err
	}
	resp, err := client.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	return checkOf(err), err
}
