//go:build fault

package fault

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Bounds the suite asserts for every scenario.
const (
	rssBoundMB      = 200.0
	healthzBound    = 100 * time.Millisecond
	tail            = 2 * time.Second // load kept after recovery, to catch late failures
	loadWorkers     = 4
	partitionExtra  = 10 * time.Second // the partition outlasts the failed-peer timeout by this
	stopLength      = 8 * time.Second
	floodHold       = 15 * time.Second
	slowBodyConns   = 10000
	bigLengthConns  = 100
	gossipFrameConn = 60
)

var (
	cl      *cluster
	results []*result
)

// result is one row of the table in docs/RELIABILITY.md.
type result struct {
	name                string
	requests, lost, cut int
	dupes               int
	recovery, bound     float64 // seconds; recovery < 0: not applicable
	peakMB              float64
	peakWho             string
	failures            []string
	notes               []string
	// written502s are lost requests the replica kill scenario admits:
	// 502s for requests written to the killed replica (see
	// written502sAllowed), counted in the verdict.
	written502s int
	// ownerGone are lost requests the scenarios that cut a router off
	// admit: owner_router_gone answers (see ownerGoneCode).
	ownerGone int
}

// written502sAllowed is how many requests the replica kill scenario may
// lose as 502s "failed after the request was sent": a request already
// written to the replica killed under it may have been running, and safe
// retries never send it again (by design). A hop is never admitted: the
// dispatch protocol retries a hop its owner had not dispatched, and one
// it had is a request written to a live replica.
const written502sAllowed = 5

// written502 is the message of the router that wrote a request to a
// replica that then failed (proxy/forward.go).
const written502 = "failed after the request was sent; not retried"

// ownerGoneCode is the error code an entry router answers with (a 502,
// or a relayed stream's error event) when the owner router of its hop
// left the mesh and did not answer after it may have dispatched the
// request (proxy/ownergone.go). The scenarios
// that cut a router off (a partition, a SIGSTOP) admit these, by design:
// the generation may be running behind the lost owner, so the router does
// not retry, and the client is told at once instead of waiting for its
// own timeout. At most one per request in flight when the router was cut
// off (loadWorkers), each generated at most once (the duplicate check).
const ownerGoneCode = "owner_router_gone"

func innerMain(m *testing.M) int {
	c, err := newCluster(os.Getenv("KVF_DIR"), os.Getenv("KVF_KVMESH"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fault suite:", err)
		return 1
	}
	cl = c
	defer c.stopAll()
	if miss := c.missingFlags(); len(miss) > 0 {
		fmt.Printf("fault suite: this kvmesh has no --%s: the scenarios that need them say so\n", strings.Join(miss, ", --"))
	}
	if err := c.startAll(); err != nil {
		fmt.Fprintln(os.Stderr, "fault suite:", err)
		return 1
	}
	if d, err := waitFor(60*time.Second, c.converged); err != nil {
		fmt.Fprintln(os.Stderr, "fault suite: the mesh did not form:", err)
		return 1
	} else {
		fmt.Printf("fault suite: mesh of %d routers and %d replicas converged in %.1fs (logs in %s)\n", numRouters, numReplicas, d.Seconds(), c.dir)
	}
	code := m.Run()
	table := renderTable(results, c.missingFlags())
	fmt.Println(table)
	if doc := os.Getenv("KVF_DOC"); doc != "" {
		if err := updateDoc(doc, table); err != nil {
			fmt.Fprintln(os.Stderr, "fault suite:", err)
			code = 1
		}
	}
	return code
}

// sc is one running scenario.
type sc struct {
	t    *testing.T
	c    *cluster
	res  *result
	rss  *rssSampler
	load *load
	ref  time.Time // when the last fault action happened
	// allowWritten502s admits up to written502sAllowed 502s for requests
	// written to a killed replica.
	allowWritten502s bool
	// allowOwnerGone admits up to loadWorkers owner_router_gone answers.
	allowOwnerGone bool
	conv           time.Time // when the mesh converged after it
}

func (s *sc) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.res.failures = append(s.res.failures, msg)
	s.t.Error(msg)
}

func (s *sc) note(format string, args ...any) {
	s.res.notes = append(s.res.notes, fmt.Sprintf(format, args...))
	s.t.Logf(format, args...)
}

// must fails the scenario now on err (a harness error, not a finding).
func (s *sc) must(err error) {
	if err != nil {
		s.t.Fatal(err)
	}
}

// mark records the fault action recovery is measured from.
func (s *sc) mark() { s.ref = time.Now() }

// converge waits for the mesh to match the processes, within bound of the
// last mark; it records the time as the scenario's recovery.
func (s *sc) converge(what string, bound time.Duration) bool {
	left := time.Until(s.ref.Add(bound))
	_, err := waitFor(max(left, 200*time.Millisecond), s.c.converged)
	if err != nil {
		s.fail("%s: not converged within %s: %v", what, bound, err)
		return false
	}
	s.conv = time.Now()
	return true
}

func allRouters() []int { return []int{1, 2, 3, 4} }

func except(i int) func() []int {
	return func() []int {
		return slices.DeleteFunc(allRouters(), func(j int) bool { return j == i })
	}
}

// scenario runs body under load from a converged mesh, then tallies the
// requests against the replicas' generation logs, checks the bounds and
// restores the mesh for the next scenario.
func scenario(t *testing.T, name string, bound time.Duration, targets func() []int, body func(s *sc)) {
	res := &result{name: name, bound: bound.Seconds(), recovery: -1}
	t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
		results = append(results, res)
		c := cl
		if _, err := waitFor(30*time.Second, c.converged); err != nil {
			t.Logf("mesh not converged before the scenario (%v); restarting it", err)
			c.restore(true)
			if _, err := waitFor(60*time.Second, c.converged); err != nil {
				res.failures = append(res.failures, "mesh did not converge before the scenario")
				t.Fatalf("mesh did not converge: %v", err)
			}
		}
		s := &sc{t: t, c: c, res: res}
		s.rss = c.sampleRSS()
		slug := strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, strings.ToLower(name))
		// Request ids stay unique when a scenario runs again (-count) in
		// the same cluster, whose replicas' id logs are kept.
		slug += strconv.Itoa(len(results))
		s.load = startLoad(slug, loadWorkers, targets)
		defer func() {
			// On a t.Fatal in body, still stop the load and restore.
			if s.load != nil {
				s.load.stop()
				s.rss.finish()
			}
			c.restore(false)
		}()
		time.Sleep(2 * time.Second) // a baseline before the fault
		body(s)
		if !s.conv.IsZero() {
			time.Sleep(tail)
		}
		recs := s.load.stop()
		s.load = nil
		res.peakMB, res.peakWho = s.rss.finish()
		time.Sleep(500 * time.Millisecond)
		gens, err := c.generations()
		if err != nil {
			t.Fatal(err)
		}
		tl := tallyOf(recs, gens)
		res.requests, res.lost, res.cut, res.dupes = tl.requests, tl.lost, tl.cut, len(tl.dupes)
		if !s.ref.IsZero() && !s.conv.IsZero() {
			end := s.conv
			if tl.lastBad.After(end) {
				end = tl.lastBad
			}
			res.recovery = max(end.Sub(s.ref).Seconds(), 0)
			if res.recovery > res.bound {
				s.fail("recovery %.1fs over the bound %.0fs", res.recovery, res.bound)
			}
		}
		t.Logf("%d requests: %d ok, %d cut while streaming, %d lost; %d connections refused and sent elsewhere",
			tl.requests, tl.ok, tl.cut, tl.lost, tl.refused)
		if tl.resets > 0 {
			s.note("%d connections reset before an answer, retried at the next router", tl.resets)
		}
		for _, smp := range tl.samples {
			t.Logf("  %s", smp)
		}
		if tl.requests < 20 {
			s.fail("only %d requests ran: the load did not flow", tl.requests)
		}
		written := 0
		for _, smp := range tl.samples {
			if s.allowWritten502s && strings.Contains(smp, "502") && strings.Contains(smp, written502) {
				written++
			}
		}
		gone := 0
		if s.allowOwnerGone && len(tl.dupes) == 0 {
			gone = len(tl.ownerGone)
		}
		switch {
		case gone > loadWorkers:
			s.fail("%d requests answered %s, more than the %d in flight when the router was cut off", gone, ownerGoneCode, loadWorkers)
		case s.allowWritten502s && tl.lost > 0 && tl.lost <= written502sAllowed && written == tl.lost && len(tl.dupes) == 0:
			res.written502s = tl.lost
			s.note("%d requests answered 502: written to the replica when it was killed, so not retried (by design)", tl.lost)
		case tl.lost > gone:
			s.fail("%d requests lost before streaming", tl.lost-gone)
		}
		if gone > 0 && gone <= loadWorkers {
			res.ownerGone = gone
			s.note("%d requests answered %s before their first event: their owner router was cut off after it may have dispatched them, so not retried (by design): %v",
				gone, ownerGoneCode, tl.ownerGone)
		}
		if len(tl.dupes) > 0 {
			s.fail("%d duplicate generations: %v", len(tl.dupes), tl.dupes[:min(len(tl.dupes), 5)])
		}
		if len(tl.unseen) > 0 {
			s.fail("harness: %d completed requests no replica logged (e.g. %s)", len(tl.unseen), tl.unseen[0])
		}
		if res.peakMB > rssBoundMB {
			s.fail("peak RSS %.0f MB (%s) over %v MB", res.peakMB, res.peakWho, rssBoundMB)
		}
	})
}

// restore brings every process back as configured: faults removed,
// stopped processes continued, dead ones restarted, the declarations of
// the topology; all=true restarts every router as well.
func (c *cluster) restore(all bool) {
	c.clearFaults()
	for _, p := range append(c.routers[1:], c.replicas[1:]...) {
		if p.paused {
			_, _ = p.signal(syscall.SIGCONT, 0)
		}
	}
	changed := map[int]bool{}
	for i := 1; i <= numRouters; i++ {
		var want []int
		for k, rs := range declaredAt {
			if slices.Contains(rs, i) {
				want = append(want, k)
			}
		}
		slices.Sort(want)
		have := slices.Clone(c.declares[i])
		slices.Sort(have)
		if !slices.Equal(want, have) {
			c.declares[i] = want
			changed[i] = true
		}
	}
	for k := 1; k <= numReplicas; k++ {
		if !c.replicas[k].running() {
			_ = c.replicas[k].start()
		}
	}
	for i := 1; i <= numRouters; i++ {
		p := c.routers[i]
		if p.running() && (all || changed[i]) {
			_, _ = p.signal(syscall.SIGKILL, 5*time.Second)
		}
		if !p.running() {
			_ = c.startRouter(i)
		}
	}
	_, _ = waitFor(30*time.Second, c.converged)
}

// TestFaults runs the scenarios in order; each starts from a converged mesh.
func TestFaults(t *testing.T) {
	c := cl

	scenario(t, "replica kill -9", 10*time.Second, allRouters, func(s *sc) {
		// A request already written to the killed replica may have been
		// running: it is answered 502 and not retried, by design.
		s.allowWritten502s = true
		_, err := c.replicas[1].signal(syscall.SIGKILL, 5*time.Second)
		s.must(err)
		s.mark()
		s.converge("routers drop the killed replica", 10*time.Second)
	})

	scenario(t, "replica SIGSTOP", 10*time.Second, allRouters, func(s *sc) {
		_, err := c.replicas[2].signal(syscall.SIGSTOP, 0)
		s.must(err)
		t0 := time.Now()
		if _, err := waitFor(stopLength, c.converged); err != nil {
			s.fail("stopped replica still routable after %s: %v", stopLength, err)
		} else {
			s.note("stopped replica out of the candidates after %.1fs", time.Since(t0).Seconds())
		}
		time.Sleep(time.Until(t0.Add(stopLength)))
		_, err = c.replicas[2].signal(syscall.SIGCONT, 0)
		s.must(err)
		s.mark()
		s.converge("continued replica back", 10*time.Second)
	})

	scenario(t, "router kill -9", 15*time.Second, except(2), func(s *sc) {
		_, err := c.routers[2].signal(syscall.SIGKILL, 5*time.Second)
		s.must(err)
		s.mark()
		if !s.converge("peers fail the killed router over (p5, declared only by it, leaves the candidates)", 15*time.Second) {
			return
		}
		t0 := time.Now()
		s.must(c.startRouter(2))
		if _, err := waitFor(15*time.Second, c.converged); err != nil {
			s.fail("restarted router not back within 15s: %v", err)
		} else {
			s.note("restarted router back in %.1fs", time.Since(t0).Seconds())
		}
	})

	scenario(t, "router SIGSTOP", 15*time.Second, except(3), func(s *sc) {
		// A hop r3 may have dispatched when it stopped is answered
		// owner_router_gone once the mesh fails r3 over, by design.
		s.allowOwnerGone = true
		_, err := c.routers[3].signal(syscall.SIGSTOP, 0)
		s.must(err)
		t0 := time.Now()
		if d, err := waitFor(stopLength, c.converged); err != nil {
			s.fail("peers did not fail the stopped router within %s: %v", stopLength, err)
		} else {
			s.note("peers failed the stopped router over in %.1fs", d.Seconds())
		}
		time.Sleep(time.Until(t0.Add(stopLength)))
		_, err = c.routers[3].signal(syscall.SIGCONT, 0)
		s.must(err)
		s.mark()
		s.converge("continued router back", 15*time.Second)
	})

	scenario(t, "partition 2+2 past failed-peer timeout", 30*time.Second, allRouters, func(s *sc) {
		// A hop whose owner may have dispatched it when the partition
		// cut them apart is answered owner_router_gone once the mesh
		// fails the owner over, by design.
		s.allowOwnerGone = true
		// Past the failed-peer timeout and past memberlist's own gossip to
		// the dead (30 probe intervals, 30 s in the LAN profile): only
		// re-joining the seeds can heal it then.
		length := max(failedPeerTimeout, 30*time.Second) + partitionExtra
		if !c.flags["failed-peer-timeout"] {
			s.fail("this kvmesh has no --failed-peer-timeout: a %s partition cannot outlast its fixed 30-minute timeout", length)
		}
		t0 := time.Now()
		s.must(c.partition([]int{1, 2}, []int{3, 4}))
		d, err := waitFor(20*time.Second, func() error {
			for i, other := range map[int][]int{1: {3, 4}, 2: {3, 4}, 3: {1, 2}, 4: {1, 2}} {
				v, err := c.view(i)
				if err != nil {
					return err
				}
				for _, j := range other {
					if v.alive(routerName(j)) {
						return fmt.Errorf("r%d still sees r%d alive", i, j)
					}
				}
			}
			return nil
		})
		if err != nil {
			s.fail("the partition did not split the mesh: %v", err)
		} else {
			s.note("split in two after %.1fs; healed after %.0fs", d.Seconds(), length.Seconds())
		}
		time.Sleep(time.Until(t0.Add(length)))
		c.clearFaults()
		s.mark()
		s.converge("partition heals", 30*time.Second)
	})

	scenario(t, "packet loss 30% UDP 10% TCP", 10*time.Second, allRouters, func(s *sc) {
		s.must(c.loss(30, 10))
		time.Sleep(20 * time.Second)
		if err := c.converged(); err != nil {
			s.note("during loss: %v", err)
		}
		c.clearFaults()
		s.mark()
		s.converge("mesh after loss", 10*time.Second)
	})

	// As a load balancer does, the client keeps sending to a router while
	// it shuts down (it must drain, and refuse new connections) and sends
	// to a restarted one only once its /readyz says 200.
	var notReady sync.Map
	readyTargets := func() []int {
		return slices.DeleteFunc(allRouters(), func(j int) bool { _, no := notReady.Load(j); return no })
	}
	scenario(t, "rolling restart of every router", 20*time.Second, readyTargets, func(s *sc) {
		worst := 0.0
		for i := 1; i <= numRouters; i++ {
			before := c.ownedVersions(i)
			d, err := c.routers[i].signal(syscall.SIGTERM, 30*time.Second)
			if err != nil {
				s.fail("r%d: %v", i, err)
			}
			notReady.Store(i, true)
			s.must(c.startRouter(i))
			s.mark()
			if rd, err := waitFor(20*time.Second, func() error { return c.ready(i) }); err != nil {
				s.fail("r%d /readyz: %v", i, err)
			} else {
				s.note("r%d ready %.1fs after its restart", i, rd.Seconds())
			}
			notReady.Delete(i)
			if !s.converge(fmt.Sprintf("r%d restarted", i), 20*time.Second) {
				return
			}
			worst = max(worst, s.conv.Sub(s.ref).Seconds())
			s.note("r%d stopped in %.1fs, converged %.1fs after its restart", i, d.Seconds(), s.conv.Sub(s.ref).Seconds())
			c.checkWarm(s, i, before)
		}
		// recovery is the worst restart, not the last.
		s.ref = s.conv.Add(-time.Duration(worst * float64(time.Second)))
	})

	scenario(t, "owner restarted without its replica", 15*time.Second, allRouters, func(s *sc) {
		v, err := c.view(1)
		s.must(err)
		rv := v.replica(replicaURL(1))
		if rv == nil {
			s.t.Fatal("r1 does not know p1")
		}
		var o int
		_, _ = fmt.Sscanf(rv.Owner, "r%d", &o)
		if o < 1 || o > numRouters {
			s.t.Fatalf("p1 has no owner (%q)", rv.Owner)
		}
		_, err = c.routers[o].signal(syscall.SIGTERM, 30*time.Second)
		if err != nil {
			s.fail("%v", err)
		}
		c.declares[o] = slices.DeleteFunc(slices.Clone(c.declares[o]), func(k int) bool { return k == 1 })
		s.must(c.startRouter(o))
		s.mark()
		s.note("p1's owner r%d restarted without it", o)
		s.converge(fmt.Sprintf("no router keeps r%d as p1's declarer", o), 15*time.Second)
	})

	c.fresh(t, 1)
	scenario(t, "slow-body flood 10000 conns", 0, allRouters, func(s *sc) {
		s.floodAPI(slowBodyConns, slowBodyPrefix(routerIP(1)), 5*time.Second)
	})

	c.fresh(t, 1)
	scenario(t, "100 x 16 MB Content-Length", 0, allRouters, func(s *sc) {
		s.floodAPI(bigLengthConns, bigLengthPrefix(routerIP(1)), 0)
	})

	c.fresh(t, 1)
	scenario(t, "60 x 20 MB gossip frames, no key", 0, allRouters, func(s *sc) {
		f := openFlood(fmt.Sprintf("%s:%d", routerIP(1), gossipPort), gossipFrameConn, func(int) []byte { return gossipFrame }, 0)
		s.note("%d of %d frames sent in full, %d refused or cut", f.open(), gossipFrameConn, f.failed.Load())
		s.probeHealthz(1, 5*time.Second)
		f.close()
		if _, err := waitFor(15*time.Second, c.converged); err != nil {
			s.fail("mesh after the gossip flood: %v", err)
		}
	})
}

// floodAPI holds n attacker connections on r1's API for floodHold while
// the load runs, and checks that r1 answers /healthz within 100 ms.
func (s *sc) floodAPI(n int, prefix func(int) []byte, trickle time.Duration) {
	f := openFlood(fmt.Sprintf("%s:%d", routerIP(1), apiPort), n, prefix, trickle)
	s.note("%d connections open, %d failed to open", f.open(), f.failed.Load())
	s.probeHealthz(1, floodHold)
	open := f.stillOpen()
	s.note("after %s, %d still held open by r1 (closed by it: %d)", floodHold, open, f.open()-open+int(f.closed.Load()))
	f.close()
	time.Sleep(2 * time.Second)
	s.note("r1 RSS 2 s after the flood closed: %.0f MB", float64(s.c.routers[1].rssKB())/1024)
}

// probeHealthz asks router i for /healthz every 500 ms for d; every
// answer must come within healthzBound.
func (s *sc) probeHealthz(i int, d time.Duration) {
	var lats []time.Duration
	var bad int
	var lastErr error
	var worstAt time.Duration
	t0 := time.Now()
	for time.Since(t0) < d {
		at := time.Since(t0)
		lat, err := s.c.healthz(i)
		if len(lats) == 0 || lat > slices.Max(lats) {
			worstAt = at
		}
		lats = append(lats, lat)
		if err != nil {
			bad++
			lastErr = err
		}
		time.Sleep(500 * time.Millisecond)
	}
	slices.Sort(lats)
	worst := lats[len(lats)-1]
	s.note("r%d /healthz median %.0f ms, slowest %.0f ms (%.1fs into the flood) of %d probes", i,
		float64(lats[len(lats)/2].Microseconds())/1000, float64(worst.Microseconds())/1000, worstAt.Seconds(), len(lats))
	if bad > 0 {
		s.fail("r%d /healthz failed %d times: %v", i, bad, lastErr)
	}
	// One outlier is tolerated (and reported above): on a shared 2-core
	// machine a single probe can lose the CPU for a few hundred ms; two
	// slow probes are the router's doing.
	if second := lats[max(len(lats)-2, 0)]; second > healthzBound {
		s.fail("r%d /healthz took over %s twice or more (second slowest %s)", i, healthzBound, second)
	}
}

// summaryPos is where a replica's summary stands: its epoch (a cold
// restart starts a new one) and version.
type summaryPos struct{ epoch, version uint64 }

// ownedVersions returns, as router i's peers see them, the summary of
// every replica i owns.
func (c *cluster) ownedVersions(i int) map[string]summaryPos {
	out := map[string]summaryPos{}
	for j := 1; j <= numRouters; j++ {
		if j == i || !c.routers[j].up() {
			continue
		}
		v, err := c.view(j)
		if err != nil {
			continue
		}
		for _, r := range v.Replicas {
			if r.Owner == routerName(i) {
				out[r.ID] = summaryPos{r.Epoch, r.Version}
			}
		}
		break
	}
	return out
}

// warmBound is how long a restarted owner may take to have its summaries
// back (its join is a push/pull with every seed).
const warmBound = 5 * time.Second

// checkWarm asserts a restarted router took its replicas' summaries back
// from its peers: the epoch its peers held before the restart, at a
// version no lower. A summary its peers held empty (version 0) has no
// warmth to keep: a new epoch loses nothing, and none is handed back.
func (c *cluster) checkWarm(s *sc, i int, before map[string]summaryPos) {
	_, err := waitFor(warmBound, func() error {
		v, err := c.view(i)
		if err != nil {
			return err
		}
		for id, pos := range before {
			rv := v.replica(id)
			if rv == nil || !rv.Owned || pos.version == 0 {
				continue // owned by another router now, or nothing to keep
			}
			if rv.Epoch != pos.epoch || rv.Version < pos.version {
				return fmt.Errorf("%s summary epoch %d version %d; before the restart its peers held epoch %d version %d",
					id, rv.Epoch, rv.Version, pos.epoch, pos.version)
			}
		}
		return nil
	})
	if err != nil {
		s.fail("r%d restarted cold: %v", i, err)
	}
}

// fresh restarts router i gracefully, so a flood measures its own memory
// and not the previous one's.
func (c *cluster) fresh(t *testing.T, i int) {
	if _, err := c.routers[i].signal(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Log(err)
	}
	if err := c.startRouter(i); err != nil {
		t.Fatal(err)
	}
	if _, err := waitFor(30*time.Second, c.converged); err != nil {
		t.Logf("after restarting r%d: %v", i, err)
	}
}

func renderTable(rs []*result, missing []string) string {
	var b strings.Builder
	b.WriteString("| fault | requests | lost | cut while streaming | duplicate generations | recovery s (bound) | peak router RSS MB | result |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rs {
		rec := "–"
		if r.recovery >= 0 {
			rec = fmt.Sprintf("%.1f (%.0f)", r.recovery, r.bound)
		} else if r.bound > 0 {
			rec = fmt.Sprintf("– (%.0f)", r.bound)
		}
		verdict := "pass"
		if r.written502s > 0 {
			verdict = fmt.Sprintf("pass, %d written to the killed replica", r.written502s)
		}
		if r.ownerGone > 0 {
			verdict = fmt.Sprintf("pass, %d answered %s", r.ownerGone, ownerGoneCode)
		}
		if len(r.failures) > 0 {
			verdict = "FAIL"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s | %.0f (%s) | %s |\n",
			r.name, r.requests, r.lost, r.cut, r.dupes, rec, r.peakMB, r.peakWho, verdict)
	}
	b.WriteString("\n")
	if len(missing) > 0 {
		fmt.Fprintf(&b, "This build has no --%s.\n\n", strings.Join(missing, ", --"))
	}
	for _, r := range rs {
		if len(r.failures) == 0 && len(r.notes) == 0 {
			continue
		}
		fmt.Fprintf(&b, "- **%s**:", r.name)
		for _, n := range r.notes {
			fmt.Fprintf(&b, " %s;", n)
		}
		for _, f := range r.failures {
			fmt.Fprintf(&b, " FAIL: %s;", f)
		}
		b.WriteString("\n")
	}
	return b.String()
}

const (
	docBegin = "<!-- fault-table:begin -->"
	docEnd   = "<!-- fault-table:end -->"
)

// updateDoc replaces the table between the markers in path.
func updateDoc(path, table string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, docBegin), strings.Index(s, docEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s ... %s markers", path, docBegin, docEnd)
	}
	stamp := fmt.Sprintf("Measured %s on %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), hostInfo())
	s = s[:i+len(docBegin)] + "\n" + stamp + table + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}

func hostInfo() string {
	n := 0
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		n = strings.Count(string(b), "\nprocessor")
		if strings.HasPrefix(string(b), "processor") {
			n++
		}
	}
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			load = fmt.Sprintf(", load average %s %s %s at the end", f[0], f[1], f[2])
		}
	}
	return fmt.Sprintf("%d CPUs%s", n, load)
}
