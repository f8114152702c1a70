// Scratch diagnostics of branch grid26 (docs/SIMULATION.md); reverted at the branch tip, not for merge.
package sim

import (
	"fmt"
	"os"
	"strings"
)

// dbgRec is one request's decision as KVG26_TRACE records it.
type dbgRec struct {
	reason                        string
	j, match, best, k             int
	nCan, aheadChosen, minAhead   int
	minAheadOwn, bestTrue, chTrue int
	viewCan, rehint, holderFull   bool
	entryJ                        int
	entryViewCan                  bool
	holderCanIdx                  int
}

func dbgOn() bool { return os.Getenv("KVG26_TRACE") != "" }

func (w *world) dbgArrive(i int32, k, j int, reason string, match, best int, rehint bool, entryJ int, entryViewCan bool) {
	if w.dbg == nil {
		w.dbg = make([]dbgRec, len(w.p.reqs))
	}
	mns := w.p.cfg.MaxNumSeqs
	d := &w.dbg[i]
	d.reason, d.j, d.match, d.best, d.k, d.rehint, d.entryJ, d.entryViewCan = reason, j, match, best, k, rehint, entryJ, entryViewCan
	d.minAhead, d.minAheadOwn = 1<<30, 1<<30
	for jj, rep := range w.rep {
		lr := rep.cache.leadingRun(w.p.reqs[i].ids)
		d.bestTrue = max(d.bestTrue, lr)
		if jj == j {
			d.chTrue = lr
		}
		ahead := rep.running + (len(rep.queue) - rep.qhead) - mns + 1
		if ahead <= 0 {
			d.nCan++
		}
		d.minAhead = min(d.minAhead, max(ahead, 0))
		if w.nR > 0 && jj%w.nR == k%w.nR {
			d.minAheadOwn = min(d.minAheadOwn, max(ahead, 0))
		}
		if jj == j {
			d.aheadChosen = max(ahead, 0)
		}
	}
}

func (w *world) dbgWrite() {
	dir := os.Getenv("KVG26_TRACE")
	if dir == "" || w.dbg == nil {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "i arr ttft wait reason j match best hit nCan aheadCh minAhead k out viewCan minAheadOwn bestTrue chTrue rehint entryJ entryViewCan n\n")
	for i := range w.dbg {
		d := &w.dbg[i]
		jb := &w.jobs[i]
		r := &w.p.reqs[i]
		dur, _ := w.p.prefillMs(r, int(jb.hit))
		fmt.Fprintf(&b, "%d %.1f %.1f %.1f %s %d %d %d %d %d %d %d %d %d %t %d %d %d %t %d %t %d\n", i, r.arrival, jb.start-r.arrival+dur, jb.start-r.arrival,
			d.reason, d.j, d.match, d.best, jb.hit, d.nCan, d.aheadChosen, d.minAhead, d.k, r.output, d.viewCan, d.minAheadOwn, d.bestTrue, d.chTrue, d.rehint, d.entryJ, d.entryViewCan, len(r.ids))
	}
	os.WriteFile(fmt.Sprintf("%s/%s.txt", dir, w.policy), []byte(b.String()), 0o644)
}

var dbgNoHeld, dbgNoWritten = os.Getenv("KVG26_NOHELD") != "", os.Getenv("KVG26_NOWRITTEN") != ""
