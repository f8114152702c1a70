package sim

import (
	"context"
	"fmt"
	"html"
	"io"
	"math"
	"strings"

	"github.com/kvmesh/kvmesh/internal/lab/trace"
)

// Baselines are the routers kvmesh-mesh must never lose to.
var Baselines = []string{PolicyRoundRobin, PolicyLeastLoaded, PolicyConsistentHash}

// Peers are the models of the peer routers' rules (peers.go).
var Peers = []string{PolicySGLang, PolicySMGMesh, PolicyDynamo, PolicyLLMD, PolicyLLMD3, PolicyProductionStack}

// GridPolicies are the policies a grid cell runs: the baselines, the mesh,
// the peer models, and for reference kvmesh's rule with one router, with
// an exact view, and over one pooled cache (the upper bound).
func GridPolicies() []string {
	out := append([]string{}, Baselines...)
	out = append(out, PolicyMesh, PolicySingle, PolicyExactView, PolicyPooled)
	return append(out, Peers...)
}

// CheckPolicies are the policies a check needs: baselines, mesh, peers.
func CheckPolicies() []string {
	out := append([]string{}, Baselines...)
	out = append(out, PolicyMesh)
	return append(out, Peers...)
}

// Workload is a named trace of a grid.
type Workload struct {
	Name string
	Reqs []trace.Request
}

// Grid is the set of operating points a grid runs: every workload at
// every load, max-num-seqs and cache fraction, the rest from Base.
type Grid struct {
	Workloads      []Workload
	Loads          []float64
	MaxNumSeqs     []int
	CacheFractions []float64
	Base           Config
}

// Cell is one operating point of a grid and how kvmesh-mesh did there.
type Cell struct {
	Workload      string  `json:"workload"`
	Load          float64 `json:"load"`
	MaxNumSeqs    int     `json:"max_num_seqs"`
	CacheFraction float64 `json:"cache_fraction"`
	Report        Report  `json:"report"`
	// Mesh is kvmesh-mesh's result.
	Mesh PolicyReport `json:"-"`
	// The best peer model on each measure (hit: highest; TTFT: lowest),
	// and the best baseline on TTFT.
	PeerHit, PeerP50, PeerP99 Named `json:"-"`
	BaseP50, BaseP99          Named `json:"-"`
}

// Named is a value and the policy that achieved it.
type Named struct {
	Name  string
	Value float64
}

// Verdict is how kvmesh-mesh compares in one cell, against the targets of
// issue 7: never worse than a baseline on TTFT p50 and p99, a hit ratio at
// least 0.97× the best peer model's, TTFT p50 and p99 at most the best
// peer model's (and never over 1.05×).
type Verdict struct {
	BaseP50, BaseP99 bool // ≤ every baseline's
	Hit              bool // ≥ 0.97 × best peer's
	PeerP50, PeerP99 bool // ≤ best peer's
	PeerTol          bool // p50 and p99 ≤ 1.05 × best peer's
}

// Pass reports whether the cell meets the hard targets (all but PeerP50
// and PeerP99, which need only hold in 90% of cells).
func (v Verdict) Pass() bool { return v.BaseP50 && v.BaseP99 && v.Hit && v.PeerTol }

// Verdict judges the cell.
func (c Cell) Verdict() Verdict {
	m := c.Mesh
	return Verdict{
		BaseP50: le(m.TTFTP50Ms, c.BaseP50.Value), BaseP99: le(m.TTFTP99Ms, c.BaseP99.Value),
		Hit:     le(0.97*c.PeerHit.Value, m.HitRatio),
		PeerP50: le(m.TTFTP50Ms, c.PeerP50.Value), PeerP99: le(m.TTFTP99Ms, c.PeerP99.Value),
		PeerTol: le(m.TTFTP50Ms, 1.05*c.PeerP50.Value) && le(m.TTFTP99Ms, 1.05*c.PeerP99.Value),
	}
}

// le is a <= b up to the rounding of virtual time: arrivals are scaled
// floats, so the same schedule under two policies can differ by 1e-10 ms.
func le(a, b float64) bool { return a <= b+1e-9*math.Abs(b)+1e-6 }

// RunGrid runs every cell of g in order, calling each (if not nil) as a
// cell completes, and returns the cells.
func RunGrid(ctx context.Context, g Grid, each func(Cell) error) ([]Cell, error) {
	var cells []Cell
	for _, wl := range g.Workloads {
		for _, mns := range g.MaxNumSeqs {
			for _, cf := range g.CacheFractions {
				for _, load := range g.Loads {
					cfg := g.Base
					cfg.Load, cfg.MaxNumSeqs, cfg.CacheFraction, cfg.CacheBlocks = load, mns, cf, 0
					rep, err := Run(ctx, cfg, wl.Reqs)
					if err != nil {
						return cells, fmt.Errorf("grid %s load %v max-num-seqs %d cache %v: %w", wl.Name, load, mns, cf, err)
					}
					c, err := judge(wl.Name, rep)
					if err != nil {
						return cells, err
					}
					cells = append(cells, c)
					if each != nil {
						if err := each(c); err != nil {
							return cells, err
						}
					}
				}
			}
		}
	}
	return cells, nil
}

func judge(name string, rep Report) (Cell, error) {
	c := Cell{Workload: name, Load: rep.Config.Load, MaxNumSeqs: rep.Config.MaxNumSeqs,
		CacheFraction: rep.Config.CacheFraction, Report: rep}
	by := map[string]PolicyReport{}
	for _, p := range rep.Policies {
		by[p.Name] = p
	}
	var ok bool
	if c.Mesh, ok = by[PolicyMesh]; !ok {
		return c, fmt.Errorf("grid: the run lacks %s", PolicyMesh)
	}
	c.PeerHit = Named{Value: -1}
	c.PeerP50, c.PeerP99 = Named{Value: math.Inf(1)}, Named{Value: math.Inf(1)}
	c.BaseP50, c.BaseP99 = c.PeerP50, c.PeerP99
	for _, n := range Peers {
		p, ok := by[n]
		if !ok {
			continue
		}
		if p.HitRatio > c.PeerHit.Value {
			c.PeerHit = Named{n, p.HitRatio}
		}
		if p.TTFTP50Ms < c.PeerP50.Value {
			c.PeerP50 = Named{n, p.TTFTP50Ms}
		}
		if p.TTFTP99Ms < c.PeerP99.Value {
			c.PeerP99 = Named{n, p.TTFTP99Ms}
		}
	}
	for _, n := range Baselines {
		p, ok := by[n]
		if !ok {
			continue
		}
		if p.TTFTP50Ms < c.BaseP50.Value {
			c.BaseP50 = Named{n, p.TTFTP50Ms}
		}
		if p.TTFTP99Ms < c.BaseP99.Value {
			c.BaseP99 = Named{n, p.TTFTP99Ms}
		}
	}
	if c.PeerHit.Name == "" || c.BaseP50.Name == "" {
		return c, fmt.Errorf("grid: the run lacks the peer models or the baselines")
	}
	return c, nil
}

// WriteGridHeader writes the column names of WriteGridLine.
func WriteGridHeader(w io.Writer) error {
	_, err := fmt.Fprintf(w, "%-15s %4s %4s %5s | %6s %7s %7s %7s | %-28s | %-28s | %s\n",
		"workload", "load", "mns", "cache", "hit", "p50", "p99", "mean",
		"best peer hit/p50/p99 ×mesh", "best baseline p50/p99", "verdict")
	return err
}

// WriteGridLine writes one cell as one line: kvmesh-mesh's figures, the
// best peer model's and the best baseline's, and the verdict.
func WriteGridLine(w io.Writer, c Cell) error {
	v := c.Verdict()
	m := c.Mesh
	_, err := fmt.Fprintf(w, "%-15s %4.2g %4d %5.2g | %6.4f %7.0f %7.0f %7.0f | %6.4f %7.0f %7.0f %-5s | %7.0f %7.0f %-12s | %s\n",
		c.Workload, c.Load, c.MaxNumSeqs, c.CacheFraction,
		m.HitRatio, m.TTFTP50Ms, m.TTFTP99Ms, m.TTFTMeanMs,
		c.PeerHit.Value, c.PeerP50.Value, c.PeerP99.Value, short(c.PeerP99.Name),
		c.BaseP50.Value, c.BaseP99.Value, c.BaseP50.Name+"/"+short(c.BaseP99.Name),
		v.String())
	return err
}

func short(name string) string {
	if len(name) > 12 {
		return name[:12]
	}
	return name
}

// String lists the failed checks, or "ok".
func (v Verdict) String() string {
	var bad []string
	if !v.BaseP50 {
		bad = append(bad, "LOSE-base-p50")
	}
	if !v.BaseP99 {
		bad = append(bad, "LOSE-base-p99")
	}
	if !v.Hit {
		bad = append(bad, "LOSE-hit")
	}
	if !v.PeerTol {
		bad = append(bad, "LOSE-peer>1.05")
	}
	if !v.PeerP50 {
		bad = append(bad, "peer-p50")
	}
	if !v.PeerP99 {
		bad = append(bad, "peer-p99")
	}
	if len(bad) == 0 {
		return "ok"
	}
	return strings.Join(bad, " ")
}

// Summary counts the cells that meet each target.
type Summary struct {
	Cells                  int
	BaseP50, BaseP99, Hit  int
	PeerP50, PeerP99, Both int // Both: p50 and p99 ≤ best peer's
	PeerTol, Pass          int
}

// Summarize counts the targets met over cells.
func Summarize(cells []Cell) Summary {
	var s Summary
	for _, c := range cells {
		v := c.Verdict()
		s.Cells++
		s.BaseP50 += b2i(v.BaseP50)
		s.BaseP99 += b2i(v.BaseP99)
		s.Hit += b2i(v.Hit)
		s.PeerP50 += b2i(v.PeerP50)
		s.PeerP99 += b2i(v.PeerP99)
		s.Both += b2i(v.PeerP50 && v.PeerP99)
		s.PeerTol += b2i(v.PeerTol)
		s.Pass += b2i(v.Pass())
	}
	return s
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Met reports whether the summary meets issue 7's targets: every cell
// passes and p50 and p99 are ≤ the best peer's in at least 90% of cells.
func (s Summary) Met() bool {
	return s.Pass == s.Cells && float64(s.Both) >= 0.9*float64(s.Cells)
}

// Write prints the summary.
func (s Summary) Write(w io.Writer) error {
	_, err := fmt.Fprintf(w, "cells %d: p50 <= every baseline %d, p99 <= every baseline %d, hit >= 0.97x best peer %d, "+
		"p50 <= best peer %d, p99 <= best peer %d, both %d (%.0f%%), within 1.05x of best peer %d; all hard targets %d; met: %v\n",
		s.Cells, s.BaseP50, s.BaseP99, s.Hit, s.PeerP50, s.PeerP99, s.Both, 100*float64(s.Both)/float64(max(s.Cells, 1)),
		s.PeerTol, s.Pass, s.Met())
	return err
}

// WriteHeatmap writes a self-contained HTML page (inline SVG, no external
// assets) with one heat-map per comparison: kvmesh-mesh's TTFT p50 and p99
// over the best peer model's and over the best baseline's, and its hit
// ratio over the best peer model's. Green is kvmesh better, red worse.
func WriteHeatmap(w io.Writer, title string, cells []Cell) error {
	var b strings.Builder
	b.WriteString("<!doctype html><html><head><meta charset=\"utf-8\"><title>")
	b.WriteString(html.EscapeString(title))
	b.WriteString("</title><style>body{font:13px sans-serif;margin:20px}h2{font-size:15px;margin:18px 0 4px}" +
		"svg text{font:11px sans-serif}</style></head><body><h1>")
	b.WriteString(html.EscapeString(title))
	b.WriteString("</h1>\n<p>Each square is one cell (rows: workload, max-num-seqs, cache fraction; columns: load). " +
		"The number is kvmesh-mesh over the comparison (lower is better for TTFT, higher for hit ratio); " +
		"green means kvmesh-mesh is at least as good. Peer routers are simulator models, not the peers' code.</p>\n")
	s := Summarize(cells)
	fmt.Fprintf(&b, "<p>%d cells; p50 &le; every baseline in %d, p99 in %d; hit &ge; 0.97&times; best peer in %d; "+
		"p50 and p99 &le; best peer in %d; within 1.05&times; in %d.</p>\n", s.Cells, s.BaseP50, s.BaseP99, s.Hit, s.Both, s.PeerTol)
	maps := []struct {
		name  string
		ratio func(Cell) float64
		lower bool
	}{
		{"TTFT p50: kvmesh-mesh / best peer model", func(c Cell) float64 { return c.Mesh.TTFTP50Ms / c.PeerP50.Value }, true},
		{"TTFT p99: kvmesh-mesh / best peer model", func(c Cell) float64 { return c.Mesh.TTFTP99Ms / c.PeerP99.Value }, true},
		{"TTFT p50: kvmesh-mesh / best baseline", func(c Cell) float64 { return c.Mesh.TTFTP50Ms / c.BaseP50.Value }, true},
		{"TTFT p99: kvmesh-mesh / best baseline", func(c Cell) float64 { return c.Mesh.TTFTP99Ms / c.BaseP99.Value }, true},
		{"hit ratio: kvmesh-mesh / best peer model", func(c Cell) float64 { return c.Mesh.HitRatio / c.PeerHit.Value }, false},
	}
	rows, cols := gridAxes(cells)
	const cw, ch, lw, top = 54, 22, 190, 20
	for _, m := range maps {
		fmt.Fprintf(&b, "<h2>%s</h2>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\">\n",
			html.EscapeString(m.name), lw+cw*len(cols)+10, top+ch*len(rows)+10)
		for ci, l := range cols {
			fmt.Fprintf(&b, "<text x=\"%d\" y=\"14\" text-anchor=\"middle\">load %g</text>\n", lw+ci*cw+cw/2, l)
		}
		for ri, r := range rows {
			fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", lw-6, top+ri*ch+15, html.EscapeString(r))
		}
		for _, c := range cells {
			ri, ci := indexOf(rows, rowKey(c)), indexOfF(cols, c.Load)
			v := m.ratio(c)
			good := v <= 1
			if !m.lower {
				good = v >= 1
			}
			fmt.Fprintf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"#fff\"><title>%s</title></rect>"+
				"<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%.2f</text>\n",
				lw+ci*cw, top+ri*ch, cw, ch, heat(v, m.lower, good), html.EscapeString(cellTitle(c)),
				lw+ci*cw+cw/2, top+ri*ch+15, v)
		}
		b.WriteString("</svg>\n")
	}
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func cellTitle(c Cell) string {
	return fmt.Sprintf("%s load %g mns %d cache %g: mesh hit %.4f p50 %.0f p99 %.0f; best peer hit %s %.4f, p50 %s %.0f, p99 %s %.0f; best baseline p50 %s %.0f, p99 %s %.0f",
		c.Workload, c.Load, c.MaxNumSeqs, c.CacheFraction, c.Mesh.HitRatio, c.Mesh.TTFTP50Ms, c.Mesh.TTFTP99Ms,
		c.PeerHit.Name, c.PeerHit.Value, c.PeerP50.Name, c.PeerP50.Value, c.PeerP99.Name, c.PeerP99.Value,
		c.BaseP50.Name, c.BaseP50.Value, c.BaseP99.Name, c.BaseP99.Value)
}

// heat colours a ratio: shades of green when kvmesh is better, of red
// when worse, saturating at a factor of 2.
func heat(v float64, lower, good bool) string {
	d := math.Abs(math.Log2(v))
	if !lower {
		d *= 4 // hit ratios differ by percents, not factors
	}
	d = math.Min(d, 1)
	if v == 1 || math.IsNaN(v) {
		return "#eeeeee"
	}
	light := int(235 - 135*d)
	if good {
		return fmt.Sprintf("#%02x%02x%02x", light, 235, light)
	}
	return fmt.Sprintf("#%02x%02x%02x", 235, light, light)
}

func rowKey(c Cell) string {
	return fmt.Sprintf("%s mns %d cache %g", c.Workload, c.MaxNumSeqs, c.CacheFraction)
}

func gridAxes(cells []Cell) (rows []string, cols []float64) {
	for _, c := range cells {
		if indexOf(rows, rowKey(c)) < 0 {
			rows = append(rows, rowKey(c))
		}
		if indexOfF(cols, c.Load) < 0 {
			cols = append(cols, c.Load)
		}
	}
	return rows, cols
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func indexOfF(s []float64, v float64) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
