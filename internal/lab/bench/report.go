package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable writes results as an aligned text table, one row per result,
// followed by a line per result that had errors, listing them by kind.
func WriteTable(w io.Writer, results []Result) error {
	// Numbers read best right-aligned, names left-aligned: pad names to one
	// width so right alignment leaves them flush left.
	nameW := len("name")
	for _, r := range results {
		nameW = max(nameW, len(r.Name))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\t", nameW, "name")
	fmt.Fprintln(tw, "ok\terrors\thit ratio\tTTFT p50 ms\tp90 ms\tp99 ms\tmean ms\tgoodput rps\tout tok/s\tqueued\twall s\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%-*s\t%d\t%d\t%.3f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.0f\t%d\t%.1f\t\n",
			nameW, r.Name, r.Requests, r.Errors, r.HitRatio, r.TTFTP50Ms, r.TTFTP90Ms, r.TTFTP99Ms,
			r.MeanTTFTMs, r.Goodput, r.OutputTokensPerS, r.QueuedRequests, r.WallSeconds)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	for _, r := range results {
		if len(r.ErrorsByKind) == 0 {
			continue
		}
		if _, err := fmt.Fprintf(w, "%s errors: %s\n", r.Name, kindsString(r.ErrorsByKind)); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
	}
	return nil
}

// kindsString lists error counts sorted by kind, so output is stable.
func kindsString(m map[string]int) string {
	kinds := make([]string, 0, len(m))
	for k := range m {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// color gives result i a distinguishable colour (Okabe–Ito, readable by
// colour-blind viewers).
func color(i int) string {
	p := [...]string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"}
	return p[i%len(p)]
}

// WriteHTMLReport writes a self-contained HTML page (inline CSS and SVG, no
// external assets): a summary table, the TTFT CDF of every result on one
// log-scale chart, and a hit-ratio bar chart.
func WriteHTMLReport(w io.Writer, results []Result) error {
	var b strings.Builder
	b.WriteString(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kvmesh bench report</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin-bottom:2em}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
svg text{font-size:12px;font-family:system-ui,sans-serif}
</style></head><body>
<h1>kvmesh bench report</h1>
<table><tr><th>front end</th><th>ok</th><th>errors</th><th>hit ratio</th><th>TTFT p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>mean ms</th><th>goodput rps</th><th>out tok/s</th><th>queued</th><th>wall s</th></tr>
`)
	for _, r := range results {
		errs := fmt.Sprint(r.Errors)
		if len(r.ErrorsByKind) > 0 {
			errs += " (" + kindsString(r.ErrorsByKind) + ")"
		}
		fmt.Fprintf(&b, "<tr><td>%s</td><td>%d</td><td>%s</td><td>%.3f</td><td>%.1f</td><td>%.1f</td><td>%.1f</td><td>%.1f</td><td>%.2f</td><td>%.0f</td><td>%d</td><td>%.1f</td></tr>\n",
			html.EscapeString(r.Name), r.Requests, html.EscapeString(errs), r.HitRatio, r.TTFTP50Ms, r.TTFTP90Ms,
			r.TTFTP99Ms, r.MeanTTFTMs, r.Goodput, r.OutputTokensPerS, r.QueuedRequests, r.WallSeconds)
	}
	b.WriteString("</table>\n<h2>Time to first token (CDF)</h2>\n")
	writeCDF(&b, results)
	b.WriteString("<h2>Prefix-cache hit ratio (cached / prompt tokens, as reported by the engines)</h2>\n")
	writeBars(&b, results)
	b.WriteString("</body></html>\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write html report: %w", err)
	}
	return nil
}

// Chart geometry shared by both charts.
const (
	chartW, chartH = 720, 360
	padL, padR     = 60, 170
	padT, padB     = 20, 40
)

// writeCDF draws one empirical CDF step line per result with a log x axis,
// because TTFTs of a loaded and an idle front end differ by orders of
// magnitude.
func writeCDF(b *strings.Builder, results []Result) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range results {
		for _, v := range r.TTFTsMs {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		b.WriteString("<p>No TTFT samples.</p>\n")
		return
	}
	lo = math.Max(lo, 0.1)
	hi = math.Max(hi, lo*10)
	lx, hx := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	pw, ph := float64(chartW-padL-padR), float64(chartH-padT-padB)
	xOf := func(v float64) float64 {
		v = math.Max(v, math.Pow(10, lx))
		return float64(padL) + (math.Log10(v)-lx)/(hx-lx)*pw
	}
	yOf := func(p float64) float64 { return float64(padT) + (1-p)*ph }

	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="TTFT CDF">`+"\n", chartW, chartH, chartW, chartH)
	for e := lx; e <= hx; e++ {
		x := xOf(math.Pow(10, e))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
			x, padT, x, chartH-padB, x, chartH-padB+15, msLabel(math.Pow(10, e)))
	}
	for _, p := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		y := yOf(p)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%g</text>`+"\n",
			padL, y, chartW-padR, y, padL-5, y, p)
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">TTFT (ms, log scale)</text>`+"\n", padL+int(pw/2), chartH-5)
	for i, r := range results {
		c := color(i)
		s := slices.Clone(r.TTFTsMs)
		slices.Sort(s)
		if len(s) > 0 {
			var pts strings.Builder
			fmt.Fprintf(&pts, "%.1f,%.1f", xOf(s[0]), yOf(0))
			// Thin to about one point per pixel column so the page stays
			// small for long runs.
			step := max(1, len(s)/int(pw))
			for j := 0; j < len(s); j += step {
				p := float64(j+1) / float64(len(s))
				fmt.Fprintf(&pts, " %.1f,%.1f", xOf(s[j]), yOf(p))
			}
			fmt.Fprintf(&pts, " %.1f,%.1f", xOf(s[len(s)-1]), yOf(1))
			fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, pts.String())
		}
		ly := padT + 10 + i*18
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s (p50 %.0f ms)</text>`+"\n",
			chartW-padR+10, ly-10, c, chartW-padR+28, ly, html.EscapeString(r.Name), r.TTFTP50Ms)
	}
	b.WriteString("</svg>\n")
}

// writeBars draws one bar per result, hit ratio on a 0..1 axis.
func writeBars(b *strings.Builder, results []Result) {
	if len(results) == 0 {
		b.WriteString("<p>No results.</p>\n")
		return
	}
	pw, ph := float64(chartW-padL-padR), float64(chartH-padT-padB)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="hit ratio">`+"\n", chartW, chartH, chartW, chartH)
	for _, p := range []float64{0, 0.25, 0.5, 0.75, 1} {
		y := float64(padT) + (1-p)*ph
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%g</text>`+"\n",
			padL, y, chartW-padR, y, padL-5, y, p)
	}
	slot := pw / float64(len(results))
	for i, r := range results {
		h := math.Max(0, math.Min(1, r.HitRatio)) * ph
		x := float64(padL) + float64(i)*slot + slot*0.15
		y := float64(padT) + ph - h
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, y, slot*0.7, h, color(i))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.3f</text>`+"\n", x+slot*0.35, y-4, r.HitRatio)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x+slot*0.35, chartH-padB+15, html.EscapeString(r.Name))
	}
	b.WriteString("</svg>\n")
}

// msLabel prints a power-of-ten millisecond tick compactly.
func msLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	default:
		return fmt.Sprintf("%gms", v)
	}
}
