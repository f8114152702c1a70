package proxy

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestTapSeesDoneWithoutASink: a stream no sink reads (a hop's entry
// router relaying the owner's answer) still tells that its last event was
// [DONE], however the body is cut into reads, so a client that leaves at
// [DONE] is answered there too, not a 499.
func TestTapSeesDoneWithoutASink(t *testing.T) {
	body := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
	for cut1 := 0; cut1 <= len(body); cut1++ {
		for _, step := range []int{1, 3, 7, len(body)} {
			tap := streamTap{firstByte: func() {}, ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"})}
			tap.data([]byte(body[:cut1]))
			for i := cut1; i < len(body); i += step {
				tap.data([]byte(body[i:min(i+step, len(body))]))
			}
			if !tap.sawDone() {
				t.Fatalf("cut at %d, steps of %d: [DONE] not seen (tail %q)", cut1, step, tap.tail[:tap.tailN])
			}
		}
	}
	tap := streamTap{firstByte: func() {}, ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"})}
	tap.data([]byte(body[:len(body)-16]))
	if tap.sawDone() {
		t.Fatalf("[DONE] seen in a stream that stopped before it (tail %q)", tap.tail[:tap.tailN])
	}
}
