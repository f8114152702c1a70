package route

import "math"

// waitExact is how many slots WaitMs follows request by request; past
// it, each further slot frees every Mean/slots. It bounds the work (the
// pass is O(waitExact² × (running + waitExact)) per step of the grid), not
// the estimate's shape: the k-th free slot's time grows by about Mean/slots
// per slot once the requests running now have been replaced.
const waitExact = 8

// WaitMs is the expected time, ms, until k sequence slots have freed at an
// engine whose slots are all taken by requests that have held them for
// ages (ms): when a request queued behind k-1 others starts. Each slot
// that frees is taken at once by the next request in the queue, which
// holds it for a fresh slot time, so the k-th free slot is the k-th end
// among the requests running now and those started since:
//
//	W(k) = ∫ P(fewer than k ends by s) ds,
//
// the ends of the running requests each following the learned
// distribution given its age (as FreeMs), and the j-th request started at
// W(j) following it from age 0. With k = 1 it is FreeMs. The count of
// ends is a sum of independent indicators (the running requests), the
// started ones placed at their expected start (a mean-field step: their
// start times are random too). A heavy tail shows in it where the slot
// count times the mean does not: slots that filled in one burst with long
// answers free late, together, and a queue behind them waits for the
// k-th of them, not k times the mean per slot. It is 0 when nothing is
// learned or no request runs: unknown.
func (t *SlotTimes) WaitMs(ages []float64, k int) float64 {
	if t.total <= 0 || len(ages) == 0 || k <= 0 {
		return 0
	}
	kx := min(k, waitExact)
	above := t.tails()
	// The grid FreeMs integrates on: steps a quarter of their start, from
	// 0.25 ms, up to the longest time a bucket holds.
	var gbuf [160]float64
	grid := gbuf[:0]
	for s, step := 0.0, 0.25; s < math.Ldexp(1, slotOctaves+1) && len(grid) < cap(gbuf); step = max(step, s/4) {
		s += step
		grid = append(grid, s)
	}
	// old[g*n+i]: running request i's survival to grid[g], given its age.
	n := len(ages)
	old := make([]float64, len(grid)*n)
	for i, a := range ages {
		a = max(a, 0)
		base := t.survival(a, &above)
		for g, s := range grid {
			if base > 0 {
				old[g*n+i] = t.survival(a+s, &above) / base
			} else {
				old[g*n+i] = math.Exp(-s / max(a, 1))
			}
		}
	}
	var starts [waitExact]float64 // W(1..kx-1): when the requests queued ahead start
	var dist [waitExact]float64
	w := 0.0
	for j := 1; j <= kx; j++ {
		// P(fewer than j ends by s), integrated by the trapezoid rule.
		sum, prev, s0 := 0.0, 1.0, 0.0
		for g, s := range grid {
			for c := range j {
				dist[c] = 0
			}
			dist[0] = 1
			for i := range n {
				ends(dist[:j], 1-old[g*n+i])
			}
			for f := range j - 1 {
				if s > starts[f] {
					ends(dist[:j], 1-t.survival(s-starts[f], &above))
				}
			}
			p := 0.0
			for c := range j {
				p += dist[c]
			}
			sum += (prev + p) / 2 * (s - s0)
			s0, prev = s, p
			if p < 1e-6 {
				break
			}
		}
		w = sum
		if j < waitExact {
			starts[j-1] = w
		}
	}
	if k > kx {
		w += float64(k-kx) * t.Mean() / float64(n)
	}
	return w
}

// ends adds one more possible end, of probability q, to dist, the
// distribution of the count of ends truncated to len(dist)-1 (the mass
// past it is dropped: only P(fewer than len(dist)) is asked).
func ends(dist []float64, q float64) {
	for c := len(dist) - 1; c > 0; c-- {
		dist[c] = dist[c]*(1-q) + dist[c-1]*q
	}
	dist[0] *= 1 - q
}
