package sim

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/trace"
)

// The hold-out seeds of the random cells: never run while tuning the
// routing, only to report how a change does on cells nobody looked at
// (docs/SIMULATION.md, random cells).
const (
	HoldoutFirst = 1000
	HoldoutCount = 20
)

// IsHoldout reports whether seed is one of the hold-out seeds.
func IsHoldout(seed uint64) bool { return seed >= HoldoutFirst && seed < HoldoutFirst+HoldoutCount }

// The loss tolerance of a random cell: kvmesh-mesh loses on a TTFT measure
// when it is worse than the best baseline's by more than LossRel of it and
// by more than LossAbsMs. Both must hold: the relative part keeps the
// percentiles' sampling noise in a cell of a thousand requests from
// counting (a p99 is the 10th-worst request), the absolute part a
// difference of a few milliseconds on a tiny TTFT.
const (
	LossRel   = 0.05
	LossAbsMs = 5.0
)

// drawRequests caps the requests of a drawn workload, so that a cell runs
// in about a second of CPU or less and a CI step can run a few dozen.
const drawRequests = 4000

// drawMinRequests is the fewest requests a drawn workload aims at (more
// sessions per group when groups × sessions × turns fall short): fewer make
// a p99 one request.
const drawMinRequests = 1000

// RandomCell is one operating point drawn over the envelope of issue 22:
// a generated chat workload and the load, sequences and cache it runs at.
type RandomCell struct {
	// Seed is the seed the cell was drawn from (DrawCellSeed); 0 when
	// drawn from a caller's generator.
	Seed          uint64               `json:"seed"`
	Workload      trace.SessionsConfig `json:"workload"`
	Load          float64              `json:"load"`
	MaxNumSeqs    int                  `json:"max_num_seqs"`
	CacheFraction float64              `json:"cache_fraction"`
	// SimSeed salts the simulator's block hashes and summaries.
	SimSeed uint64 `json:"sim_seed"`
}

// DrawCellSeed draws the cell of a seed: the same seed, the same cell.
func DrawCellSeed(seed uint64) RandomCell {
	c := DrawCell(rand.New(rand.NewPCG(seed, 0x72616e646f6d))) // "random"
	c.Seed = seed
	return c
}

// DrawCell draws a cell over the envelope: groups 1–64 × sessions 1–32 per
// group (log-uniform; more sessions when the workload would have fewer
// than drawMinRequests requests), turns with a median of 1–12, a system
// prompt of none or 64–2,048 tokens, group prefixes of none or 128–8,192,
// lognormal or Pareto questions (median 16–2,048 tokens) and answers
// (8–1,024), a context cap of 8k, 32k or 128k tokens, 1 to all sessions
// open at once, Poisson, bursty or bucketed arrivals; load 0.2–0.95,
// max-num-seqs 1–256 (log-uniform), and a cache of 0.1–2× the workload's
// distinct blocks (log-uniform). At most drawRequests requests.
func DrawCell(rng *rand.Rand) RandomCell {
	w := trace.SessionsConfig{
		Groups:           logUniformInt(rng, 1, 64),
		SessionsPerGroup: logUniformInt(rng, 1, 32),
		Turns:            drawLength(rng, []string{trace.LengthFixed, trace.LengthLognormal, trace.LengthPareto}, 1, 12, 1, 40),
		Question:         drawLength(rng, []string{trace.LengthLognormal, trace.LengthPareto}, 16, 2048, 1, 16384),
		Answer:           drawLength(rng, []string{trace.LengthLognormal, trace.LengthPareto}, 8, 1024, 1, 4096),
		MaxContextTokens: []int{8192, 32768, 131072}[rng.IntN(3)],
		Requests:         drawRequests,
		Seed:             rng.Uint64(),
	}
	if rng.IntN(2) == 1 {
		w.SystemTokens = logUniformInt(rng, 64, 2048)
	}
	w.Prefix = drawLength(rng, []string{trace.LengthFixed, trace.LengthLognormal}, 128, 8192, 0, 32768)
	if rng.Float64() < 0.15 {
		w.Prefix = trace.Length{Dist: trace.LengthFixed}
	}
	if want := float64(drawMinRequests) / (float64(w.Groups) * math.Max(w.Turns.Median, 1)); float64(w.SessionsPerGroup) < want {
		w.SessionsPerGroup = int(math.Ceil(want))
	}
	w.ActiveSessions = logUniformInt(rng, 1, w.Groups*w.SessionsPerGroup)
	const rate = 4.0 // the load scaling sets the real rate; the knobs below are relative to it
	w.Arrivals = trace.Arrivals{Rate: rate}
	switch rng.IntN(3) {
	case 0:
		w.Arrivals.Process = trace.ArrivalPoisson
	case 1:
		w.Arrivals.Process = trace.ArrivalBursty
		w.Arrivals.OnShare = 0.05 + 0.45*rng.Float64()
		w.Arrivals.Period = seconds(logUniform(rng, 5, 500) / rate) // a cycle of 5–500 arrivals
	default:
		w.Arrivals.Process = trace.ArrivalBucketed
		w.Arrivals.Bucket = seconds(logUniform(rng, 0.5, 50) / rate) // 0.5–50 arrivals a tick
	}
	return RandomCell{
		Workload:      w,
		Load:          0.2 + 0.75*rng.Float64(),
		MaxNumSeqs:    logUniformInt(rng, 1, 256),
		CacheFraction: logUniform(rng, 0.1, 2),
		SimSeed:       rng.Uint64(),
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func logUniform(rng *rand.Rand, lo, hi float64) float64 {
	return math.Exp(math.Log(lo) + rng.Float64()*(math.Log(hi)-math.Log(lo)))
}

// logUniformInt draws an integer in [lo, hi], log-uniformly.
func logUniformInt(rng *rand.Rand, lo, hi int) int {
	return min(int(logUniform(rng, float64(lo), float64(hi)+1)), hi)
}

// drawLength draws a length distribution of one of dists with a median
// log-uniform in [lo, hi]: σ 0.2–1.5 for a lognormal, α 1.1–3 for a Pareto.
func drawLength(rng *rand.Rand, dists []string, lo, hi float64, minV, maxV int) trace.Length {
	l := trace.Length{Dist: dists[rng.IntN(len(dists))], Median: math.Round(logUniform(rng, lo, hi)), Min: minV, Max: maxV}
	switch l.Dist {
	case trace.LengthLognormal:
		l.Shape = 0.2 + 1.3*rng.Float64()
	case trace.LengthPareto:
		l.Shape = 1.1 + 1.9*rng.Float64()
	}
	return l
}

// Describe is a short description of the cell's workload.
func (c RandomCell) Describe() string {
	w := c.Workload
	arr := w.Arrivals.Process
	switch arr {
	case trace.ArrivalBursty:
		arr = fmt.Sprintf("bursty(on %.2f)", w.Arrivals.OnShare)
	case trace.ArrivalBucketed:
		arr = fmt.Sprintf("bucketed(%.1f/tick)", w.Arrivals.Bucket.Seconds()*w.Arrivals.Rate)
	}
	return fmt.Sprintf("%dx%d turns %s sys %d prefix %s q %s a %s open %d ctx %dk %s",
		w.Groups, w.SessionsPerGroup, lengthShort(w.Turns), w.SystemTokens, lengthShort(w.Prefix),
		lengthShort(w.Question), lengthShort(w.Answer), w.ActiveSessions, w.MaxContextTokens/1024, arr)
}

func lengthShort(l trace.Length) string {
	switch l.Dist {
	case trace.LengthLognormal:
		return fmt.Sprintf("%gln%.1f", l.Median, l.Shape)
	case trace.LengthPareto:
		return fmt.Sprintf("%gpa%.1f", l.Median, l.Shape)
	}
	return fmt.Sprintf("%g", l.Median)
}

// RandomPolicies are the policies a random cell runs: the baselines and
// the mesh.
func RandomPolicies() []string { return append(append([]string{}, Baselines...), PolicyMesh) }

// Loss is one TTFT measure on which kvmesh-mesh lost to the best baseline
// beyond the tolerance (LossRel and LossAbsMs).
type Loss struct {
	Measure  string  `json:"measure"` // "p50" or "p99"
	Baseline string  `json:"baseline"`
	MeshMs   float64 `json:"mesh_ms"`
	BaseMs   float64 `json:"baseline_ms"`
}

// RandomResult is how kvmesh-mesh did in a random cell against each
// baseline.
type RandomResult struct {
	Cell      RandomCell     `json:"cell"`
	Requests  int            `json:"requests"`
	Mesh      PolicyReport   `json:"mesh"`
	Baselines []PolicyReport `json:"baselines"`
	Losses    []Loss         `json:"losses"`
	// HitBelow names the baseline whose hit ratio kvmesh-mesh's is below
	// by more than LossRel of it and 0.01, if any: printed, not a loss (the
	// rule gives up cache hits for load, and TTFT is what it answers for).
	HitBelow string `json:"hit_below,omitempty"`
}

// RunRandomCell generates the cell's workload and runs the baselines and
// kvmesh-mesh on it; base gives everything the cell does not draw.
func RunRandomCell(ctx context.Context, base Config, c RandomCell) (RandomResult, error) {
	reqs, err := trace.Sessions(c.Workload)
	if err != nil {
		return RandomResult{}, fmt.Errorf("random cell %d: %w", c.Seed, err)
	}
	cfg := base
	cfg.Load, cfg.MaxNumSeqs, cfg.CacheFraction, cfg.CacheBlocks = c.Load, c.MaxNumSeqs, c.CacheFraction, 0
	cfg.Seed = c.SimSeed
	cfg.Policies = RandomPolicies()
	rep, err := Run(ctx, cfg, reqs)
	if err != nil {
		return RandomResult{}, fmt.Errorf("random cell %d: %w", c.Seed, err)
	}
	return judgeRandom(c, len(reqs), rep)
}

func judgeRandom(c RandomCell, n int, rep Report) (RandomResult, error) {
	r := RandomResult{Cell: c, Requests: n}
	found := false
	for _, p := range rep.Policies {
		if p.Name == PolicyMesh {
			r.Mesh, found = p, true
		} else {
			r.Baselines = append(r.Baselines, p)
		}
	}
	if !found || len(r.Baselines) == 0 {
		return r, fmt.Errorf("random cell %d: the run lacks %s or the baselines", c.Seed, PolicyMesh)
	}
	r.Losses = Losses(r.Mesh, r.Baselines)
	best := r.Baselines[0]
	for _, b := range r.Baselines[1:] {
		if b.HitRatio > best.HitRatio {
			best = b
		}
	}
	if d := best.HitRatio - r.Mesh.HitRatio; d > LossRel*best.HitRatio && d > 0.01 {
		r.HitBelow = best.Name
	}
	return r, nil
}

// Losses lists the TTFT measures on which mesh is worse than the best of
// baselines by more than the tolerance, naming that baseline.
func Losses(mesh PolicyReport, baselines []PolicyReport) []Loss {
	var out []Loss
	for _, m := range []struct {
		name string
		get  func(PolicyReport) float64
	}{{"p50", func(p PolicyReport) float64 { return p.TTFTP50Ms }}, {"p99", func(p PolicyReport) float64 { return p.TTFTP99Ms }}} {
		best := baselines[0]
		for _, b := range baselines[1:] {
			if m.get(b) < m.get(best) {
				best = b
			}
		}
		if Lost(m.get(mesh), m.get(best)) {
			out = append(out, Loss{Measure: m.name, Baseline: best.Name, MeshMs: m.get(mesh), BaseMs: m.get(best)})
		}
	}
	return out
}

// Lost reports whether a TTFT of meshMs loses to baseMs: worse by more
// than LossRel of it and by more than LossAbsMs.
func Lost(meshMs, baseMs float64) bool {
	return meshMs > baseMs*(1+LossRel) && meshMs-baseMs > LossAbsMs
}

// WriteRandomHeader writes the column names of WriteRandomLine.
func WriteRandomHeader(w io.Writer) error {
	_, err := fmt.Fprintf(w, "%-8s %4s %4s %5s %5s | %-21s | %-21s | %-21s | %-21s | %s | %s\n",
		"seed", "load", "mns", "cache", "reqs", "kvmesh-mesh hit/p50/p99", "round-robin", "least-loaded", "consistent-hash",
		"verdict", "workload")
	return err
}

// WriteRandomLine writes one random cell as one line: the cell, each
// policy's hit ratio and TTFT p50/p99 (ms), the verdict and the workload.
func WriteRandomLine(w io.Writer, r RandomResult) error {
	var b strings.Builder
	c := r.Cell
	fmt.Fprintf(&b, "%-8d %4.2f %4d %5.2f %5d", c.Seed, c.Load, c.MaxNumSeqs, c.CacheFraction, r.Requests)
	for _, p := range append([]PolicyReport{r.Mesh}, r.Baselines...) {
		fmt.Fprintf(&b, " | %.3f %7.0f %7.0f", p.HitRatio, p.TTFTP50Ms, p.TTFTP99Ms)
	}
	b.WriteString(" | ")
	b.WriteString(r.Verdict())
	b.WriteString(" | ")
	b.WriteString(c.Describe())
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

// Verdict is "ok", or each loss as LOSS-p99-vs-least-loaded(+12%,+30ms);
// a hit ratio below a baseline's follows as a note.
func (r RandomResult) Verdict() string {
	var parts []string
	for _, l := range r.Losses {
		parts = append(parts, fmt.Sprintf("LOSS-%s-vs-%s(+%.0f%%,+%.0fms)", l.Measure, l.Baseline,
			100*(l.MeshMs/l.BaseMs-1), l.MeshMs-l.BaseMs))
	}
	if len(parts) == 0 {
		parts = append(parts, "ok")
	}
	if r.HitBelow != "" {
		parts = append(parts, "(hit<"+r.HitBelow+")")
	}
	return strings.Join(parts, " ")
}

// RandomSummary counts the losses of a set of random cells by measure,
// baseline, max-num-seqs and load.
type RandomSummary struct {
	Cells, Lost, HitBelow int
	ByMeasure             map[string]int // p50, p99
	ByBaseline            map[string]int
	ByMaxNumSeqs          map[string]int // 1-4, 5-32, 33-256
	ByLoad                map[string]int // <0.5, 0.5-0.8, >=0.8
	// P50Ratio and P99Ratio are the geometric means, over the cells, of
	// kvmesh-mesh's TTFT p50 and p99 over the best baseline's on that
	// measure (each TTFT floored at 1 ms). The loss count moves by a few
	// cells between rules that change no cell much (a cell near the
	// tolerance tips either way); the ratios show how far every cell
	// moved, so two rules compare on them first, the count second.
	P50Ratio, P99Ratio float64
}

// SummarizeRandom counts the losses of results.
func SummarizeRandom(results []RandomResult) RandomSummary {
	s := RandomSummary{ByMeasure: map[string]int{}, ByBaseline: map[string]int{}, ByMaxNumSeqs: map[string]int{}, ByLoad: map[string]int{}}
	var logP50, logP99 float64
	for _, r := range results {
		s.Cells++
		if len(r.Baselines) > 0 {
			logP50 += logRatio(r.Mesh.TTFTP50Ms, r.Baselines, func(p PolicyReport) float64 { return p.TTFTP50Ms })
			logP99 += logRatio(r.Mesh.TTFTP99Ms, r.Baselines, func(p PolicyReport) float64 { return p.TTFTP99Ms })
		}
		if r.HitBelow != "" {
			s.HitBelow++
		}
		if len(r.Losses) == 0 {
			continue
		}
		s.Lost++
		for _, l := range r.Losses {
			s.ByMeasure[l.Measure]++
			s.ByBaseline[l.Baseline]++
		}
		s.ByMaxNumSeqs[mnsBand(r.Cell.MaxNumSeqs)]++
		s.ByLoad[loadBand(r.Cell.Load)]++
	}
	if s.Cells > 0 {
		s.P50Ratio, s.P99Ratio = math.Exp(logP50/float64(s.Cells)), math.Exp(logP99/float64(s.Cells))
	}
	return s
}

// logRatio is the log of mesh over the least of get over baselines, both
// floored at 1 ms (a TTFT of 0 would make the ratio infinite).
func logRatio(mesh float64, baselines []PolicyReport, get func(PolicyReport) float64) float64 {
	best := get(baselines[0])
	for _, b := range baselines[1:] {
		best = min(best, get(b))
	}
	return math.Log(max(mesh, 1) / max(best, 1))
}

func mnsBand(n int) string {
	switch {
	case n <= 4:
		return "mns 1-4"
	case n <= 32:
		return "mns 5-32"
	}
	return "mns 33-256"
}

func loadBand(l float64) string {
	switch {
	case l < 0.5:
		return "load <0.5"
	case l < 0.8:
		return "load 0.5-0.8"
	}
	return "load >=0.8"
}

// Write prints the summary on one line.
func (s RandomSummary) Write(w io.Writer) error {
	_, err := fmt.Fprintf(w, "random cells %d: lost %d (p50 %d, p99 %d; vs %s; %s; %s); hit ratio below a baseline's in %d (not a loss); TTFT over the best baseline's, geometric mean of the cells: p50 %.3fx, p99 %.3fx; tolerance: worse than the best baseline by >%.0f%% and >%.0f ms\n",
		s.Cells, s.Lost, s.ByMeasure["p50"], s.ByMeasure["p99"], counts(s.ByBaseline, Baselines),
		counts(s.ByMaxNumSeqs, []string{"mns 1-4", "mns 5-32", "mns 33-256"}),
		counts(s.ByLoad, []string{"load <0.5", "load 0.5-0.8", "load >=0.8"}), s.HitBelow, s.P50Ratio, s.P99Ratio, 100*LossRel, LossAbsMs)
	return err
}

func counts(m map[string]int, keys []string) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
