// Scratch diagnostics and knobs of branch grid25 (docs/SIMULATION.md); reverted at the branch tip, not for merge.
package sim

import (
	"fmt"
	"github.com/kvmesh/kvmesh/route"
	"os"
	"strings"
)

// Scratch diagnostics (not for merge): KVG25_TRACE=dir writes one file per
// cell and policy with a line per request.
type dbgRec struct {
	reason                                 string
	j, n, match, best, hit                 int
	canChosen, nCan, aheadChosen, minAhead int
	inflChosen, minInfl                    int
	ttft, wait, prefill                    float64
	local                                  bool
	slotsKnown                             int
	viewCan                                bool
	minAheadOwn                            int
	bestTrue, chosenTrue                   int
}

func (w *world) dbgOn() bool { return os.Getenv("KVG25_TRACE") != "" }

func (w *world) dbgArrive(i int32, j int, reason string, match, best int, local bool) {
	if w.dbg == nil {
		w.dbg = make([]dbgRec, len(w.p.reqs))
	}
	mns := w.p.cfg.MaxNumSeqs
	d := &w.dbg[i]
	d.reason, d.j, d.n, d.match, d.best, d.local = reason, j, len(w.p.reqs[i].ids), match, best, local
	d.minAhead, d.minInfl, d.minAheadOwn = 1<<30, 1<<30, 1<<30
	for jj, rep := range w.rep {
		lr := rep.cache.leadingRun(w.p.reqs[i].ids)
		d.bestTrue = max(d.bestTrue, lr)
		if jj == j {
			d.chosenTrue = lr
		}
		ahead := rep.running + (len(rep.queue) - rep.qhead) - mns + 1
		if ahead <= 0 {
			d.nCan++
		}
		d.minAhead = min(d.minAhead, max(ahead, 0))
		d.minInfl = min(d.minInfl, rep.inFlight)
		if w.nR > 0 && jj%w.nR == j%w.nR {
			d.minAheadOwn = min(d.minAheadOwn, max(ahead, 0))
		}
		if jj == j {
			d.aheadChosen, d.inflChosen = max(ahead, 0), rep.inFlight
			if ahead <= 0 {
				d.canChosen = 1
			}
		}
	}
}

func (w *world) dbgWrite() {
	dir := os.Getenv("KVG25_TRACE")
	if dir == "" || w.dbg == nil {
		return
	}
	var b strings.Builder
	for i := range w.dbg {
		d := &w.dbg[i]
		jb := &w.jobs[i]
		r := &w.p.reqs[i]
		dur, _ := w.p.prefillMs(r, int(jb.hit))
		fmt.Fprintf(&b, "%d %.1f %.1f %.1f %s %d %d %d %d %d %d %d %d %d %d %d %t %d %d %t %d %d %d\n", i, r.arrival, jb.start-r.arrival+dur, jb.start-r.arrival,
			d.reason, d.j, d.n, d.match, d.best, jb.hit, d.canChosen, d.nCan, d.aheadChosen, d.minAhead, d.inflChosen, d.minInfl, d.local, r.output, d.slotsKnown, d.viewCan, d.minAheadOwn, d.bestTrue, d.chosenTrue)
	}
	os.WriteFile(fmt.Sprintf("%s/%d-%s.txt", dir, w.p.cfg.Seed, w.policy), []byte(b.String()), 0o644)
}

func (w *world) dbgHop2() string { return os.Getenv("KVG25_HOP2") }

func (w *world) dbgCanStart(c []route.Candidate, i int) bool {
	x := &c[i]
	if x.Slots > 0 {
		return x.InFlight < x.Slots
	}
	return x.Waiting == 0
}

func (w *world) dbgIdle(i int) bool {
	return w.dbgCanStart(w.cands, i) && w.cands[i].PendingPrefillBlocks < 1
}

func (w *world) dbgDump(i int32, k int, what string, c []route.Candidate, chosen int) {
	v := os.Getenv("KVG25_DUMP")
	if v == "" || w.policy != "kvmesh-mesh" || fmt.Sprint(i) != v {
		return
	}
	fmt.Fprintf(os.Stderr, "req %d router %d %s chose %d t=%.1f\n", i, k, what, chosen, w.now)
	for x := range c {
		cc := &c[x]
		fmt.Fprintf(os.Stderr, "  %d local=%v infl=%d pend=%.1f run=%d wait=%d slots=%d min=%d seq=%.0f free=%.0f age=%.0f own=%d\n", x, cc.Detail.Local, cc.InFlight, cc.PendingPrefillBlocks, cc.Running, cc.Waiting, cc.Slots, cc.MinSlots, cc.Detail.SeqMs, cc.Detail.FreeMs, cc.Detail.SlotAgeMs, cc.Detail.Own)
	}
	for jj, rep := range w.rep {
		fmt.Fprintf(os.Stderr, "  true %d run=%d q=%d infl=%d match=%d\n", jj, rep.running, len(rep.queue)-rep.qhead, rep.inFlight, rep.cache.leadingRun(w.p.reqs[i].ids))
	}
}
