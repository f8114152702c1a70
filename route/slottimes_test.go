package route

import (
	"math"
	"testing"
)

func learned(times ...float64) SlotTimes {
	var t SlotTimes
	for _, ms := range times {
		t.Observe(ms)
	}
	return t
}

// Before any slot time is seen, nothing is known: the mean and the free
// time are 0, which the decision reads as unknown.
func TestSlotTimesEmpty(t *testing.T) {
	var st SlotTimes
	st.Observe(0)
	st.Observe(math.NaN())
	st.Observe(-5)
	if st.Mean() != 0 || st.FreeMs([]float64{100}) != 0 {
		t.Fatalf("mean %v, free %v after no valid time, want 0 and 0", st.Mean(), st.FreeMs([]float64{100}))
	}
	st = learned(1000)
	if got := st.FreeMs(nil); got != 0 {
		t.Fatalf("free %v ms with no request running, want 0", got)
	}
}

// With answers of one length, a request's remaining time is that length
// less its age, to within a bucket's width, as the mean says.
func TestSlotTimesFixedLength(t *testing.T) {
	st := learned()
	for range 300 {
		st.Observe(1000)
	}
	if m := st.Mean(); math.Abs(m-1000) > 1e-6 {
		t.Fatalf("mean %v, want 1000", m)
	}
	for _, tc := range []struct{ age, want float64 }{{0, 1000}, {400, 600}, {900, 100}} {
		if got := st.FreeMs([]float64{tc.age}); math.Abs(got-tc.want) > 0.2*1000 {
			t.Errorf("age %v: free in %v ms, want about %v", tc.age, got, tc.want)
		}
	}
}

// With heavy-tailed answers (most short, a few a hundred times longer), a
// request that has run past the short ones is likely a long one: it is
// expected to run on for much longer than the mean, where the mean less
// its age says it ends at once.
func TestSlotTimesHeavyTail(t *testing.T) {
	st := learned()
	for i := range 400 {
		if i%20 == 0 {
			st.Observe(40000)
		} else {
			st.Observe(400)
		}
	}
	mean := st.Mean()
	if mean > 3000 {
		t.Fatalf("mean %v, want about 2380", mean)
	}
	young := st.FreeMs([]float64{100})
	old := st.FreeMs([]float64{2000})
	if !(old > 10*mean) {
		t.Fatalf("a request 2 s old frees in %v ms, want far past the mean %v (it is a long one)", old, mean)
	}
	if !(young < old) {
		t.Fatalf("a young request frees in %v ms, an old one in %v: want the young sooner", young, old)
	}
}

// A request older than every time seen is expected to run about as long
// again; of several running requests, the first ends sooner than any one.
func TestSlotTimesPastAllAndSeveral(t *testing.T) {
	st := learned()
	for range 100 {
		st.Observe(1000)
	}
	if got := st.FreeMs([]float64{8000}); got < 4000 || got > 16000 {
		t.Fatalf("a request older than all seen frees in %v ms, want about its age 8000", got)
	}
	var exp SlotTimes
	for i := range 500 {
		// Exponential times of mean 1000 ms, by their quantiles.
		exp.Observe(-1000 * math.Log(1-(float64(i)+0.5)/500))
	}
	one := exp.FreeMs([]float64{0})
	four := exp.FreeMs([]float64{0, 0, 0, 0})
	if !(four < one/2) {
		t.Fatalf("first of four ends in %v ms, one in %v: want about a quarter", four, one)
	}
}
