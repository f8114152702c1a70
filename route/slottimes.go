package route

import (
	"math"
)

// SlotTimes' buckets: bucket 0 holds times under 1 ms, the others
// slotSub to a doubling of the time, up to 2^slotOctaves ms (about 200
// days) where the last one holds everything longer. A quarter of an
// octave (19 %) keeps the estimate close for answers of nearly one length,
// where a request's remaining time is the mean less its age to within a
// bucket's width.
const (
	slotSub     = 4
	slotOctaves = 34
	slotBuckets = 2 + slotSub*slotOctaves
)

// slotWindow is how many answers SlotTimes remembers, about: each new one
// weighs 1 and the older ones decay by 1 - 1/slotWindow. A tail is what
// it must see: at 1 % of the answers, a window of a few hundred holds a
// few of them, where the mean's 16 (the proxy's running mean) would hold
// one every six windows and forget it within one.
const slotWindow = 256

// SlotTimes learns how long requests hold a sequence slot at an engine
// (prefill and decode, so mostly the answer's length at a decode-bound
// engine): a histogram of the times seen, in buckets of doubling width,
// decaying so that the recent answers count most. It tells the mean and,
// given how long the requests running there have already run, when the
// first of them is expected to end. A mean alone cannot: with heavy-tailed
// answers a request running longer than the mean is likely a long one,
// and will likely run longer still, where "the mean less its age" says it
// ends at once. It is a value (about 2 KB): the owner of the measurements
// keeps one per replica and asks it while it holds them.
type SlotTimes struct {
	n, sum [slotBuckets]float64 // decayed count and sum of the times (ms) in each bucket
	total  float64              // Σ n
}

func slotBucket(ms float64) int {
	if !(ms >= 1) {
		return 0
	}
	if ms >= math.Ldexp(1, slotOctaves) {
		return slotBuckets - 1
	}
	return 1 + int(math.Log2(ms)*slotSub)
}

// bucketEdges are the bounds of bucket b: [lo, hi).
func bucketEdges(b int) (lo, hi float64) {
	if b == 0 {
		return 0, 1
	}
	return math.Exp2(float64(b-1) / slotSub), math.Exp2(float64(b) / slotSub)
}

// Observe adds one request's slot time, ms; a time that is not positive
// and finite says nothing and is ignored.
func (t *SlotTimes) Observe(ms float64) {
	if !(ms > 0) || math.IsInf(ms, 1) {
		return
	}
	const keep = 1 - 1.0/slotWindow
	for b := range t.n {
		t.n[b] *= keep
		t.sum[b] *= keep
	}
	b := slotBucket(ms)
	t.n[b]++
	t.sum[b] += ms
	t.total = t.total*keep + 1
}

// Mean is the mean slot time, ms; 0 before any.
func (t *SlotTimes) Mean() float64 {
	if t.total <= 0 {
		return 0
	}
	s := 0.0
	for _, v := range t.sum {
		s += v
	}
	return s / t.total
}

// tails returns, for each bucket, the count in the buckets above it.
func (t *SlotTimes) tails() (above [slotBuckets]float64) {
	s := 0.0
	for b := slotBuckets - 1; b >= 0; b-- {
		above[b] = s
		s += t.n[b]
	}
	return above
}

// survival is the share of the times seen longer than x, the times spread
// evenly within a bucket; above is tails().
func (t *SlotTimes) survival(x float64, above *[slotBuckets]float64) float64 {
	if t.total <= 0 {
		return 0
	}
	bx := slotBucket(x)
	s := above[bx]
	if n := t.n[bx]; n > 0 {
		lo, hi := bucketEdges(bx)
		if bx == slotBuckets-1 {
			hi = 2 * lo
		}
		// Within the bucket, the times spread evenly between lo and
		// twice its mean less lo (so that the spread keeps its mean),
		// capped at the bucket.
		top := min(hi, max(2*t.sum[bx]/n-lo, lo))
		if x < top {
			s += n * (top - x) / (top - lo)
		}
	}
	return s / t.total
}

// FreeMs is the expected time, ms, until the first of requests that have
// held their slots for ages (ms) ends: ∫ Π P(T > a+s | T > a) ds over the
// learned distribution of slot times T. A request older than any time
// seen ends, by this estimate, after as long again as it has run (half
// the requests of a heavy tail that reach an age live to twice it). It is
// 0 before any time is learned or without ages: unknown.
func (t *SlotTimes) FreeMs(ages []float64) float64 {
	if t.total <= 0 || len(ages) == 0 {
		return 0
	}
	// base[i] is request i's survival at its age, 0 when the times seen
	// say nothing of it (older than all).
	above := t.tails()
	var buf [8]float64
	base := buf[:0]
	for _, a := range ages {
		base = append(base, t.survival(max(a, 0), &above))
	}
	left := func(s float64) float64 { // P(no request ended by s)
		p := 1.0
		for i, a := range ages {
			a = max(a, 0)
			if base[i] > 0 {
				p *= t.survival(a+s, &above) / base[i]
			} else {
				p *= math.Exp(-s / max(a, 1))
			}
			if p < 1e-6 {
				return 0
			}
		}
		return p
	}
	// The trapezoid rule on a grid of steps a quarter of their start
	// (from 0.25 ms), which follows the buckets' doubling widths.
	sum, s, prev := 0.0, 0.0, 1.0
	for step := 0.25; s < math.Ldexp(1, slotOctaves+1); step = max(step, s/4) {
		next := s + step
		p := left(next)
		sum += (prev + p) / 2 * step
		if p == 0 {
			break
		}
		s, prev = next, p
	}
	return sum
}
