// Package scale runs N kvmesh routers in one process, over an in-memory
// network with latency and loss (or real memberlist sockets on
// 127.0.0.1), fronting R replicas, under a stream of new prompts, and
// measures what issue 9 asks of dissemination: gossip bytes per router,
// CPU per request, memory, how long a recorded prefix takes to be seen at
// another router, how often a conversation's next turn is matched at
// another router, and the routing decision's latency.
//
// Replicas are instant: a request is routed by the real route.Policy over
// the real mesh view, and the owner of the chosen replica records the
// prompt, as the proxy does when the replica accepts it.
package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/threadcpu"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
)

// Config is one run.
type Config struct {
	Routers, Replicas int
	// Rate is new prompts per second over all routers, sent round-robin.
	Rate float64
	// Duration of the load.
	Duration time.Duration
	// MinBlocks and MaxBlocks bound a new prompt's length in blocks (a
	// 4-8 KB prompt is 4-8 blocks of the default contract).
	MinBlocks, MaxBlocks int
	// Capacity is each replica's cache in blocks (its summary's size).
	Capacity int
	// Latency (one way) and Loss (packets) of the in-memory network.
	Latency time.Duration
	Loss    float64
	// Real runs memberlist over UDP/TCP on 127.0.0.1 instead.
	Real bool
	// Timing of the mesh; zero means mesh.LANTiming.
	Timing mesh.Timing
	// DecideEvery runs the routing decision for one request in this many
	// (1: all); the others go where consistent hashing of their first
	// block puts them, which is where a cold decision puts a new prompt.
	// A decision over 1,024 replicas costs a hundred microseconds or more
	// of this process's shared CPU (docs/history/benchmarks.md), which would
	// otherwise cap the request rate the harness can drive below what the
	// mesh sustains.
	DecideEvery int
	// Replays earlier prompts, each with one more turn, are sent to
	// another router than the first time, right after the load (issue 9's
	// method).
	Replays int
	Seed    uint64
	// Progress receives a line per phase; nil discards.
	Progress io.Writer
}

func (c *Config) defaults() {
	if c.Routers == 0 {
		c.Routers = 3
	}
	if c.Replicas == 0 {
		c.Replicas = 6
	}
	if c.Rate == 0 {
		c.Rate = 200
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.MinBlocks == 0 {
		c.MinBlocks, c.MaxBlocks = 4, 8
	}
	c.MaxBlocks = max(c.MaxBlocks, c.MinBlocks)
	if c.Capacity == 0 {
		c.Capacity = 4096
	}
	c.DecideEvery = max(c.DecideEvery, 1)
	if c.Timing == (mesh.Timing{}) {
		c.Timing = mesh.LANTiming()
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// RouterStats is one router's traffic during the load, per second.
type RouterStats struct {
	Name string
	// MeshIn and MeshOut are the mesh's own message bytes (batches,
	// requests, push/pull state).
	MeshIn, MeshOut float64
	// NetIn and NetOut are everything on the in-memory network,
	// memberlist's probes and framing included (0 with Real).
	NetIn, NetOut float64
	// NewBlocks is the blocks this router recorded as owner.
	NewBlocks float64
}

// Result is what a run measured.
type Result struct {
	Config   Config
	Requests int
	Elapsed  time.Duration
	Routers  []RouterStats
	// CPUPerRequest is the process's CPU time (every router, the load
	// generator and the decisions) per request.
	CPUPerRequest time.Duration
	// HeapPerRouter is the Go heap in use divided by the routers; RSS is
	// the whole process's.
	HeapPerRouter, RSS uint64
	// Visibility: time from a record at the owner to a full match at
	// another router.
	VisP50, VisP99, VisMax time.Duration
	VisSamples, VisMissed  int
	// NextTurns are conversations continued at another router during the
	// load, at least a second after their first turn, whose first turn the
	// owner's summary still holds (not evicted); Matched counts those
	// routed to the replica holding the first turn, with all of it matched.
	NextTurns, NextTurnsMatched int
	// Replays after the load, as issue 9's table, among prompts still
	// held; ReplaysEvicted were drawn but no longer held by the owner.
	Replays, ReplaysMatched, ReplaysEvicted int
	// Decision is Candidates + probes + Pick at the receiving router,
	// during the load (all routers share this process's CPUs).
	DecisionP50, DecisionP99 time.Duration
	// DecisionCPU is the decision's CPU time on its thread (0 when the
	// platform cannot tell): what is left of the wall time is waiting for
	// a core, or for a lock.
	DecisionCPUP50, DecisionCPUP99 time.Duration
	// IdleDecision is the same on a quiet mesh, before the load: one
	// router's decision cost, as in a process of its own.
	IdleDecisionP50, IdleDecisionP99 time.Duration
	// DeltaBytesPerBlock is the delta payload per block per peer (the
	// part of the gossip that grows with new blocks).
	DeltaBytesPerBlock float64
	// FullCopies by reason, all routers; Resyncs are copies' requests.
	FullCopies map[string]float64
	Resyncs    float64
	// FullsInstalled and FullsEqual count full copies received, all
	// routers: installed, or equal to the copy held and so kept (the
	// Index keeps the copy's column as it is).
	FullsInstalled, FullsEqual float64
	// Runtime is the Go runtime's account of the load (runtime/metrics):
	// what the collector and the scheduler took of the process, which the
	// decision's wall time shares.
	Runtime RuntimeStats
}

// RuntimeStats is the Go runtime's view of the load phase.
type RuntimeStats struct {
	GOMAXPROCS int
	// GCCycles completed during the load; GCPauseP99 and GCPauseMax are
	// of their stop-the-world pauses (bucket upper bounds).
	GCCycles               uint64
	GCPauseP99, GCPauseMax time.Duration
	// GCCPU is all the collector's CPU during the load, GCAssistCPU the
	// part charged to allocating goroutines (assists).
	GCCPU, GCAssistCPU time.Duration
	// SchedLatencyP99 is how long a runnable goroutine waited for a P
	// (bucket upper bound): the queue within the process.
	SchedLatencyP99 time.Duration
	// AllocBytes is the heap allocated during the load, every router's
	// and the generator's: what sets the collector's pace.
	AllocBytes uint64
}

// MeshOutPerRouter is the mean of MeshOut.
func (r *Result) MeshOutPerRouter() float64 {
	s := 0.0
	for _, x := range r.Routers {
		s += x.MeshOut
	}
	return s / float64(len(r.Routers))
}

// BytesPerBlockPerPeer is all mesh bytes out over all new blocks sent to
// every peer: the constant (states, push/pull) included.
func (r *Result) BytesPerBlockPerPeer() float64 {
	out, blocks := 0.0, 0.0
	for _, x := range r.Routers {
		out += x.MeshOut
		blocks += x.NewBlocks
	}
	if blocks == 0 || len(r.Routers) < 2 {
		return 0
	}
	return out / (blocks * float64(len(r.Routers)-1))
}

type router struct {
	m   *mesh.Mesh
	reg *prometheus.Registry
	tr  *Transport
}

type prompt struct {
	hashes  []uint64
	replica string
	router  int // where it was first sent
	at      time.Time
}

type sample struct {
	id     string
	probes []summary.Probe
	at     time.Time
	check  int
}

// Run runs one configuration.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.defaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, 1))
	netw := NewNetwork(cfg.Latency, cfg.Loss, cfg.Seed)
	routers := make([]*router, cfg.Routers)
	defer func() {
		var wg sync.WaitGroup
		for _, r := range routers {
			if r != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					_ = r.m.Close(cctx)
				}()
			}
		}
		wg.Wait()
	}()
	var seed string
	for i := range routers {
		r := &router{reg: prometheus.NewRegistry()}
		name := fmt.Sprintf("r%02d", i)
		mc := mesh.Config{Name: name, Region: "r1", APIAddr: "http://" + name + ".test", Contract: summary.DefaultContract(),
			DefaultCapacityBlocks: cfg.Capacity, Timing: cfg.Timing, Registerer: r.reg}
		if cfg.Real {
			mc.BindAddr = "127.0.0.1:0"
		} else {
			r.tr = netw.NewTransport()
			mc.Transport = r.tr
		}
		if i > 0 {
			mc.Join = []string{seed}
		}
		m, err := mesh.New(ctx, mc)
		if err != nil {
			return nil, err
		}
		r.m = m
		routers[i] = r
		if i == 0 {
			seed = m.GossipAddr()
		}
	}
	ids := make([]string, cfg.Replicas)
	ownerOf := map[string]int{}
	for j := range ids {
		ids[j] = fmt.Sprintf("http://replica-%04d:8000", j)
		o := j % cfg.Routers
		ownerOf[ids[j]] = o
		routers[o].m.DeclareReplica(ids[j])
		routers[o].m.UpdateReplica(ids[j], mesh.ReplicaStatus{Models: []string{"m"}, Healthy: true, CapacityBlocks: cfg.Capacity})
	}
	fmt.Fprintf(cfg.Progress, "scale: %d routers, %d replicas: converging\n", cfg.Routers, cfg.Replicas)
	if err := converge(ctx, routers, cfg.Replicas, 120*time.Second, cfg.Progress); err != nil {
		return nil, err
	}

	res := &Result{Config: cfg, FullCopies: map[string]float64{}}
	policy := route.DefaultPolicy()
	warmDecisions(routers, policy, cfg, rng)
	res.IdleDecisionP50, res.IdleDecisionP99 = idleDecisions(routers[0].m, policy, cfg, rng)
	before := snapshot(routers)
	rt0 := readRuntime()
	cpu0 := cpuTime()

	var mu sync.Mutex
	var pending []sample
	var lags []time.Duration
	missed := 0
	checkerDone := make(chan struct{})
	stopChecker := make(chan struct{})
	go func() {
		defer close(checkerDone)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopChecker:
				return
			case <-t.C:
			}
			mu.Lock()
			ps := pending
			pending = nil
			mu.Unlock()
			now := time.Now()
			keep := ps[:0]
			for _, s := range ps {
				switch {
				case routers[s.check].m.MatchReplica(s.id, s.probes) >= len(s.probes):
					lags = append(lags, now.Sub(s.at))
				case now.Sub(s.at) > 10*time.Second:
					missed++
				default:
					keep = append(keep, s)
				}
			}
			mu.Lock()
			pending = append(keep, pending...)
			mu.Unlock()
		}
	}()

	var history []prompt
	var decisions, decisionCPU []time.Duration
	var lastCPU time.Duration // of route1's last decision; -1 unknown
	// The decisions' thread CPU is read on a thread of their own.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// One buffer for every router's decisions: they run one at a time
	// here, and a proxy keeps one per request in flight (mesh.CandidateBuffer).
	var buf mesh.CandidateBuffer
	var probes []summary.Probe
	newBlocks := make([]float64, cfg.Routers)
	sampleEvery := max(int(cfg.Rate/200), 1) // about 200 visibility samples a second
	turnEvery := max(int(cfg.Rate/100), 1)   // about 100 next turns a second
	route1 := func(k int, hashes []uint64) (string, route.Decision, time.Duration) {
		// The thread's CPU clock is a system call, read outside the wall
		// clock's window: a thread the kernel has marked to be switched
		// out is switched on the way back from a system call, so the
		// call inside the window pulled in a switch that would have come
		// after the decision (2.4-3.0% of the decisions under load, in
		// the fill, against 0.8-1.2% spread over the phases with the
		// call outside). The decision itself makes none.
		c0, cpuOK := threadcpu.Now()
		t0 := time.Now()
		cands := routers[k].m.CandidatesInto("m", &buf)
		probes = summary.MakeProbes(probes[:0], hashes)
		req := route.Request{Hashes: hashes, Probes: probes, Root: hashes[0] ^ 1}
		d := policy.Pick(req, cands)
		took := time.Since(t0)
		lastCPU = -1
		if c1, ok := threadcpu.Now(); cpuOK && ok {
			lastCPU = c1 - c0
		}
		if d.Index < 0 {
			return "", d, took
		}
		return cands[d.Index].ID(), d, took
	}
	fmt.Fprintf(cfg.Progress, "scale: load %.0f req/s for %v\n", cfg.Rate, cfg.Duration)
	start := time.Now()
	i := 0
	for {
		el := time.Since(start)
		if el >= cfg.Duration || ctx.Err() != nil {
			break
		}
		// A generator that falls behind catches up within the run only:
		// it stops at Duration whatever it still owes (Requests says how
		// many it sent).
		for target := int(el.Seconds() * cfg.Rate); i < target && (i%64 != 0 || time.Since(start) < cfg.Duration); i++ {
			k := i % cfg.Routers
			n := cfg.MinBlocks + rng.IntN(cfg.MaxBlocks-cfg.MinBlocks+1)
			hashes := make([]uint64, n)
			for b := range hashes {
				hashes[b] = rng.Uint64()
			}
			var id string
			if i%cfg.DecideEvery == 0 {
				var took time.Duration
				id, _, took = route1(k, hashes)
				decisions = append(decisions, took)
				if lastCPU >= 0 {
					decisionCPU = append(decisionCPU, lastCPU)
				}
				if id == "" {
					continue
				}
			} else {
				id = ids[hashes[0]%uint64(len(ids))]
			}
			o := ownerOf[id]
			routers[o].m.Record(id, hashes)
			newBlocks[o] += float64(n)
			now := time.Now()
			if cfg.Routers > 1 && i%sampleEvery == 0 {
				check := (o + 1 + rng.IntN(cfg.Routers-1)) % cfg.Routers
				mu.Lock()
				pending = append(pending, sample{id: id, probes: summary.MakeProbes(nil, hashes), at: now, check: check})
				mu.Unlock()
			}
			if len(history) < 50000 {
				history = append(history, prompt{hashes: hashes, replica: id, router: k, at: now})
			} else {
				history[rng.IntN(len(history))] = prompt{hashes: hashes, replica: id, router: k, at: now}
			}
			if cfg.Routers > 1 && i%turnEvery == 0 {
				if p, ok := pickEarlier(rng, history, now.Add(-time.Second)); ok && held(routers, ownerOf, p) {
					res.NextTurns++
					if nextTurnMatched(route1, p, rng, cfg.Routers) {
						res.NextTurnsMatched++
					}
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
	res.Elapsed = time.Since(start)
	res.Requests = i
	cpu1 := cpuTime()
	res.Runtime = runtimeStats(rt0, readRuntime())
	after := snapshot(routers)
	secs := res.Elapsed.Seconds()
	var db, de float64
	for k, r := range routers {
		st := RouterStats{Name: fmt.Sprintf("r%02d", k), NewBlocks: newBlocks[k] / secs,
			MeshIn: (after[k].meshIn - before[k].meshIn) / secs, MeshOut: (after[k].meshOut - before[k].meshOut) / secs}
		if r.tr != nil {
			st.NetIn, st.NetOut = (after[k].netIn-before[k].netIn)/secs, (after[k].netOut-before[k].netOut)/secs
		}
		res.Routers = append(res.Routers, st)
		for why, v := range after[k].full {
			res.FullCopies[why] += v - before[k].full[why]
		}
		res.Resyncs += after[k].resyncs - before[k].resyncs
		res.FullsInstalled += after[k].fullsIn["installed"] - before[k].fullsIn["installed"]
		res.FullsEqual += after[k].fullsIn["equal"] - before[k].fullsIn["equal"]
		db += after[k].deltaBytes - before[k].deltaBytes
		de += after[k].deltaEntries - before[k].deltaEntries
	}
	if de > 0 {
		res.DeltaBytesPerBlock = db / de
	}
	if res.Requests > 0 {
		res.CPUPerRequest = (cpu1 - cpu0) / time.Duration(res.Requests)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapPerRouter = ms.HeapInuse / uint64(cfg.Routers)
	res.RSS = rss()

	// Let the last samples land, then stop the checker.
	time.Sleep(2 * time.Second)
	close(stopChecker)
	<-checkerDone
	mu.Lock()
	missed += len(pending)
	mu.Unlock()
	slices.Sort(lags)
	res.VisSamples, res.VisMissed = len(lags), missed
	if len(lags) > 0 {
		res.VisP50, res.VisP99, res.VisMax = lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1]
	}
	slices.Sort(decisions)
	if len(decisions) > 0 {
		res.DecisionP50, res.DecisionP99 = decisions[len(decisions)/2], decisions[len(decisions)*99/100]
	}
	slices.Sort(decisionCPU)
	if len(decisionCPU) > 0 {
		res.DecisionCPUP50, res.DecisionCPUP99 = decisionCPU[len(decisionCPU)/2], decisionCPU[len(decisionCPU)*99/100]
	}

	// Issue 9's replays: earlier prompts, one more turn, another router.
	if cfg.Routers > 1 {
		for try := 0; res.Replays < cfg.Replays && try < 100*cfg.Replays && len(history) > 0; try++ {
			p := history[rng.IntN(len(history))]
			if !held(routers, ownerOf, p) {
				res.ReplaysEvicted++
				continue
			}
			res.Replays++
			if nextTurnMatched(route1, p, rng, cfg.Routers) {
				res.ReplaysMatched++
			}
		}
	}
	return res, nil
}

// warmDecisions makes a few untimed decisions at every router, as a
// router's first requests do: the first decisions over a large view bind
// its summaries into the mesh's Index (summary.Index, up to 256 per
// decision), which the timed decisions should not pay.
func warmDecisions(routers []*router, policy route.Policy, cfg Config, rng *rand.Rand) {
	var buf mesh.CandidateBuffer
	hashes := make([]uint64, cfg.MaxBlocks)
	for _, r := range routers {
		for range cfg.Replicas/summary.IndexMinSummaries + 2 {
			for b := range hashes {
				hashes[b] = rng.Uint64()
			}
			cands := r.m.CandidatesInto("m", &buf)
			policy.Pick(route.Request{Hashes: hashes, Probes: summary.MakeProbes(nil, hashes), Root: 1}, cands)
		}
	}
}

// idleDecisions times 2,000 decisions of new prompts at one router
// before the load.
func idleDecisions(m *mesh.Mesh, policy route.Policy, cfg Config, rng *rand.Rand) (p50, p99 time.Duration) {
	var buf mesh.CandidateBuffer
	took := make([]time.Duration, 0, 2000)
	hashes := make([]uint64, cfg.MaxBlocks)
	probes := make([]summary.Probe, 0, cfg.MaxBlocks)
	for range 2000 {
		for b := range hashes {
			hashes[b] = rng.Uint64()
		}
		t0 := time.Now()
		cands := m.CandidatesInto("m", &buf)
		probes = summary.MakeProbes(probes[:0], hashes)
		policy.Pick(route.Request{Hashes: hashes, Probes: probes, Root: 1}, cands)
		took = append(took, time.Since(t0))
	}
	slices.Sort(took)
	return took[len(took)/2], took[len(took)*99/100]
}

// held reports whether the owner's own summary still holds all of the
// prompt: an evicted prompt says nothing about dissemination.
func held(routers []*router, ownerOf map[string]int, p prompt) bool {
	return routers[ownerOf[p.replica]].m.MatchReplica(p.replica, summary.MakeProbes(nil, p.hashes)) >= len(p.hashes)
}

// pickEarlier picks a prompt first sent before cutoff.
func pickEarlier(rng *rand.Rand, h []prompt, cutoff time.Time) (prompt, bool) {
	for range 8 {
		if len(h) == 0 {
			break
		}
		if p := h[rng.IntN(len(h))]; p.at.Before(cutoff) {
			return p, true
		}
	}
	return prompt{}, false
}

// nextTurnMatched sends the prompt's next turn to another router and
// reports whether it went to the replica holding the first turn with all
// of it matched.
func nextTurnMatched(route1 func(int, []uint64) (string, route.Decision, time.Duration), p prompt, rng *rand.Rand, n int) bool {
	k := (p.router + 1 + rng.IntN(n-1)) % n
	next := append(slices.Clip(p.hashes), rng.Uint64())
	id, d, _ := route1(k, next)
	return id == p.replica && d.Match >= len(p.hashes)
}

func converge(ctx context.Context, routers []*router, replicas int, limit time.Duration, progress io.Writer) error {
	start := time.Now()
	deadline := start.Add(limit)
	lastLog := start
	var cands []route.Candidate
	for {
		ok := true
		worst := replicas
		for _, r := range routers {
			cands = r.m.Candidates("m", cands[:0])
			n := 0
			for _, c := range cands {
				if c.Summary != nil {
					n++
				}
			}
			worst = min(worst, n)
			if n < replicas {
				ok = false
				break
			}
		}
		if ok {
			fmt.Fprintf(progress, "scale: converged in %v\n", time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			fmt.Fprintf(progress, "scale: a router counts %d of %d replicas after %v\n", worst, replicas, time.Since(start).Round(time.Second))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("scale: routers did not converge on every replica")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type counters struct {
	meshIn, meshOut, netIn, netOut, resyncs float64
	deltaBytes, deltaEntries                float64
	full, fullsIn                           map[string]float64
}

func snapshot(routers []*router) []counters {
	out := make([]counters, len(routers))
	for k, r := range routers {
		c := counters{full: map[string]float64{}, fullsIn: map[string]float64{}}
		mfs, _ := r.reg.Gather()
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				label := func(name string) string {
					for _, l := range m.GetLabel() {
						if l.GetName() == name {
							return l.GetValue()
						}
					}
					return ""
				}
				switch mf.GetName() {
				case "kvmesh_gossip_bytes_total":
					if label("direction") == "in" {
						c.meshIn = m.GetCounter().GetValue()
					} else {
						c.meshOut = m.GetCounter().GetValue()
					}
				case "kvmesh_summary_full_copies_total":
					c.full[label("reason")] = m.GetCounter().GetValue()
				case "kvmesh_summary_full_copies_received_total":
					c.fullsIn[label("outcome")] = m.GetCounter().GetValue()
				case "kvmesh_summary_resyncs_total":
					c.resyncs = m.GetCounter().GetValue()
				case "kvmesh_summary_delta_bytes_total":
					c.deltaBytes = m.GetCounter().GetValue()
				case "kvmesh_summary_delta_entries_total":
					c.deltaEntries = m.GetCounter().GetValue()
				}
			}
		}
		if r.tr != nil {
			c.netIn, c.netOut = float64(r.tr.In.Load()), float64(r.tr.Out.Load())
		}
		out[k] = c
	}
	return out
}

// runtime/metrics read before and after the load.
var runtimeMetrics = []string{"/gc/cycles/total:gc-cycles", "/gc/pauses:seconds", "/cpu/classes/gc/total:cpu-seconds",
	"/cpu/classes/gc/mark/assist:cpu-seconds", "/sched/latencies:seconds", "/gc/heap/allocs:bytes"}

func readRuntime() []metrics.Sample {
	ss := make([]metrics.Sample, len(runtimeMetrics))
	for i, name := range runtimeMetrics {
		ss[i].Name = name
	}
	metrics.Read(ss)
	return ss
}

// runtimeStats is what the runtime's counters and histograms (cumulative)
// gained from a to b.
func runtimeStats(a, b []metrics.Sample) RuntimeStats {
	st := RuntimeStats{GOMAXPROCS: runtime.GOMAXPROCS(0)}
	u := func(i int) uint64 {
		if b[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return b[i].Value.Uint64() - a[i].Value.Uint64()
	}
	f := func(i int) time.Duration {
		if b[i].Value.Kind() != metrics.KindFloat64 {
			return 0
		}
		return time.Duration((b[i].Value.Float64() - a[i].Value.Float64()) * 1e9)
	}
	st.GCCycles, st.GCCPU, st.GCAssistCPU, st.AllocBytes = u(0), f(2), f(3), u(5)
	st.GCPauseP99, st.GCPauseMax = histDelta(a[1], b[1], 0.99), histDelta(a[1], b[1], 1)
	st.SchedLatencyP99 = histDelta(a[4], b[4], 0.99)
	return st
}

// histDelta is the q-quantile (an upper bound of its bucket) of what the
// histogram b counted since a; 0 when it counted nothing.
func histDelta(a, b metrics.Sample, q float64) time.Duration {
	if a.Value.Kind() != metrics.KindFloat64Histogram || b.Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	ha, hb := a.Value.Float64Histogram(), b.Value.Float64Histogram()
	if len(ha.Counts) != len(hb.Counts) {
		return 0
	}
	var total uint64
	for i := range hb.Counts {
		total += hb.Counts[i] - ha.Counts[i]
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	var n uint64
	for i := range hb.Counts {
		n += hb.Counts[i] - ha.Counts[i]
		if n >= max(want, 1) {
			upper := hb.Buckets[i+1]
			if math.IsInf(upper, 1) {
				upper = hb.Buckets[i]
			}
			return time.Duration(upper * 1e9)
		}
	}
	return 0
}

// cpuTime is the process's CPU time, 0 where it is not read.
func cpuTime() time.Duration {
	d, _ := threadcpu.Process()
	return d
}

// rss is the process's resident set (Linux), 0 when unknown.
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Report writes a result as text.
func (r *Result) Report(w io.Writer) {
	c := r.Config
	net := "in-memory"
	if c.Real {
		net = "127.0.0.1"
	}
	fmt.Fprintf(w, "%d routers x %d replicas (cache %d blocks), %.0f req/s of new %d-%d block prompts for %v (%s, latency %v, loss %.0f%%), %d requests (%.0f/s), 1 in %d decided\n",
		c.Routers, c.Replicas, c.Capacity, c.Rate, c.MinBlocks, c.MaxBlocks, r.Elapsed.Round(time.Millisecond), net, c.Latency, 100*c.Loss,
		r.Requests, float64(r.Requests)/r.Elapsed.Seconds(), c.DecideEvery)
	fmt.Fprintf(w, "  gossip per router: mesh out %.1f KB/s (in %.1f KB/s), network out %.1f KB/s; per new block per peer: %.2f bytes of delta, %.2f bytes all told (states, push/pull included)\n",
		r.MeshOutPerRouter()/1e3, mean(r.Routers, func(s RouterStats) float64 { return s.MeshIn })/1e3,
		mean(r.Routers, func(s RouterStats) float64 { return s.NetOut })/1e3, r.DeltaBytesPerBlock, r.BytesPerBlockPerPeer())
	fmt.Fprintf(w, "  visibility at another router: p50 %v p99 %v max %v (%d samples, %d not seen within 10 s)\n",
		r.VisP50.Round(time.Millisecond), r.VisP99.Round(time.Millisecond), r.VisMax.Round(time.Millisecond), r.VisSamples, r.VisMissed)
	fmt.Fprintf(w, "  next turns at another router matched: %d/%d during the load, %d/%d replayed after it (%d drawn were evicted at the owner)\n",
		r.NextTurnsMatched, r.NextTurns, r.ReplaysMatched, r.Replays, r.ReplaysEvicted)
	fmt.Fprintf(w, "  full copies: overflow %.0f, send_error %.0f, request %.0f, cheaper %.0f, log %.0f; copies' requests %.0f; received: installed %.0f, equal to the copy (kept) %.0f\n",
		r.FullCopies["overflow"], r.FullCopies["send_error"], r.FullCopies["request"], r.FullCopies["cheaper"], r.FullCopies["log"], r.Resyncs,
		r.FullsInstalled, r.FullsEqual)
	fmt.Fprintf(w, "  decision on a quiet mesh p50 %v p99 %v (%d-block prompts)\n", r.IdleDecisionP50.Round(time.Microsecond/10),
		r.IdleDecisionP99.Round(time.Microsecond/10), c.MaxBlocks)
	fmt.Fprintf(w, "  decision under load p50 %v p99 %v (its thread's CPU p50 %v p99 %v); CPU %v per request (whole process); heap %.1f MB per router, RSS %.0f MB total\n",
		r.DecisionP50.Round(time.Microsecond/10), r.DecisionP99.Round(time.Microsecond/10),
		r.DecisionCPUP50.Round(time.Microsecond/10), r.DecisionCPUP99.Round(time.Microsecond/10), r.CPUPerRequest.Round(time.Microsecond/10),
		float64(r.HeapPerRouter)/1e6, float64(r.RSS)/1e6)
	rt := r.Runtime
	perReq := 0.0
	if r.Requests > 0 {
		perReq = float64(rt.AllocBytes) / float64(r.Requests) / 1e3
	}
	fmt.Fprintf(w, "  runtime during the load (GOMAXPROCS %d): %.0f MB allocated (%.1f KB per request), %d GC cycles, pauses p99 %v max %v, GC CPU %v (assists %v), goroutines' wait for a P p99 %v\n",
		rt.GOMAXPROCS, float64(rt.AllocBytes)/1e6, perReq, rt.GCCycles, rt.GCPauseP99.Round(time.Microsecond), rt.GCPauseMax.Round(time.Microsecond),
		rt.GCCPU.Round(time.Millisecond), rt.GCAssistCPU.Round(time.Millisecond), rt.SchedLatencyP99.Round(time.Microsecond))
}

func mean(rs []RouterStats, f func(RouterStats) float64) float64 {
	s := 0.0
	for _, r := range rs {
		s += f(r)
	}
	return s / float64(max(len(rs), 1))
}
