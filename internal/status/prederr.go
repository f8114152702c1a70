package status

import (
	"fmt"
	"math"
	"slices"
	"strconv"
)

// predErrView is the distribution of predicted minus reported cached
// blocks per response, drawn as an inline SVG histogram.
type predErrView struct {
	Has                        bool
	Count, Mean, P50, P90, P99 string
	Forgotten                  string // blocks forgotten since start
	RecentForgotten            string // over the window, "" without one
	Bars                       []histBar
	Width                      int // px of the SVG
	Mid                        int // px, the middle
}

// histBar is one bucket of an SVG histogram.
type histBar struct {
	X, Y, W, H, LabelX string // px
	Label, Range       string // the axis label; the bucket's range (tooltip)
	Count              string
	Le                 string // the bucket's upper bound as Prometheus names it
	Class              string
}

// predErrOf draws the prediction-error histogram: one bar per bucket,
// negative buckets (under-prediction) pale, the one around zero green,
// positive ones (over-prediction, blocks the summaries wrongly claimed)
// orange.
func predErrOf(h hist) predErrView {
	pv := predErrView{Has: len(h.bounds) > 0, Count: humanCount(h.count), Mean: "—", P50: "—", P90: "—", P99: "—"}
	if !pv.Has {
		return pv
	}
	if h.count > 0 {
		pv.Mean = signedBlocks(h.sum / h.count)
	}
	for q, dst := range map[float64]*string{0.5: &pv.P50, 0.9: &pv.P90, 0.99: &pv.P99} {
		if x, ok := h.quantile(q); ok {
			*dst = signedBlocks(x)
		}
	}
	counts := h.buckets()
	top := max(slices.Max(counts), 1)
	for i, c := range counts {
		b := histBar{Count: humanCount(c), Class: "bar"}
		hi := math.Inf(+1)
		if i < len(h.bounds) {
			hi = h.bounds[i]
		}
		switch {
		case i == 0:
			b.Label, b.Range = "≤"+bound(hi), "at most "+bound(hi)
		case i == len(h.bounds):
			b.Label, b.Range = ">"+bound(h.bounds[i-1]), "over "+bound(h.bounds[i-1])
		default:
			b.Label, b.Range = "≤"+bound(hi), "over "+bound(h.bounds[i-1])+", at most "+bound(hi)
		}
		b.Le = "+Inf"
		if !math.IsInf(hi, +1) {
			b.Le = fmt.Sprint(hi)
		}
		lo := math.Inf(-1)
		if i > 0 {
			lo = h.bounds[i-1]
		}
		switch {
		case lo >= 1: // over-predicted by more than a block: blocks wrongly claimed
			b.Class = "bar warn"
		case hi <= -1: // under-predicted: the engine held more
			b.Class = "bar alt"
		default:
			b.Class = "bar up"
		}
		hpx := c / top * histBarsH
		x := float64(i * histCol)
		b.X, b.W = fmt.Sprintf("%.0f", x+3), fmt.Sprint(histCol-6)
		b.H, b.Y = fmt.Sprintf("%.1f", hpx), fmt.Sprintf("%.1f", histTop+histBarsH-hpx)
		b.LabelX = fmt.Sprintf("%.0f", x+histCol/2)
		pv.Bars = append(pv.Bars, b)
	}
	pv.Width = len(counts) * histCol
	pv.Mid = pv.Width / 2
	return pv
}

// bound is a bucket bound as short as it is exact (0.5, 64).
func bound(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func signedBlocks(f float64) string {
	if f == 0 {
		return "0"
	}
	return fmt.Sprintf("%+.1f", f)
}
