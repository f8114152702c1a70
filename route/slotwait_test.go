package route

import (
	"math"
	"testing"
)

// With k = 1 the wait is the first end: FreeMs (integrated on a coarser
// grid, so to within a tenth).
func TestWaitMsFirstIsFreeMs(t *testing.T) {
	st := learned()
	for i := range 400 {
		if i%20 == 0 {
			st.Observe(40000)
		} else {
			st.Observe(400)
		}
	}
	for _, ages := range [][]float64{{100}, {100, 2000}, {10, 300, 900, 5000}} {
		f, w := st.FreeMs(ages), st.WaitMs(ages, 1)
		if math.Abs(f-w) > 0.1*f {
			t.Errorf("ages %v: WaitMs(1) %v, FreeMs %v", ages, w, f)
		}
	}
}

// With answers of one length, the k-th slot frees when the k-th oldest
// running request ends, and past the running ones a slot frees one
// length after the one it replaced.
func TestWaitMsFixedLength(t *testing.T) {
	st := learned()
	for range 300 {
		st.Observe(1000)
	}
	ages := []float64{900, 600, 300, 0}
	for _, tc := range []struct {
		k    int
		want float64
	}{{1, 100}, {2, 400}, {3, 700}, {4, 1000}, {5, 1100}, {6, 1400}} {
		if got := st.WaitMs(ages, tc.k); math.Abs(got-tc.want) > 0.2*1000 {
			t.Errorf("k %d: %v ms, want about %v", tc.k, got, tc.want)
		}
	}
	if got := st.WaitMs([]float64{500}, 3); math.Abs(got-2500) > 0.2*1000 {
		t.Errorf("one slot, third in line: %v ms, want about 2500", got)
	}
}
