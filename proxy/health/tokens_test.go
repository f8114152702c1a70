package health

import (
	"sync"
	"testing"
)

// TestCapacityAtTheLearnedRatio: the engine's cache tokens become router
// blocks at the replica's learned bytes per token; the capacity follows a
// ratio that moved by more than an eighth (the first learned one), not
// the drift of its average.
func TestCapacityAtTheLearnedRatio(t *testing.T) {
	e := &engineReplica{metrics: vllmMetrics} // 2048 blocks of 16 tokens
	rep := newReplica(t, e.serve)
	var mu sync.Mutex
	ratio := 0.0 // not learned: the default
	bpt := func(id string) float64 {
		mu.Lock()
		defer mu.Unlock()
		if id != rep.URL {
			t.Errorf("asked the ratio of %q", id)
		}
		return ratio
	}
	var got reports
	h := New(Config{BytesPerToken: bpt}, []string{rep.URL}, nil, got.add, 1024, nil, nil)
	steps := []struct {
		ratio float64
		want  int // 32768 tokens × ratio / 1024 bytes per block, in the ratio in use
	}{
		{0, 128},   // the default 4
		{4.4, 128}, // drifts within an eighth: kept
		{4.8, 153}, // llama.cpp's learnt ratio on Gemma 3: followed
		{5.2, 153}, // its average drifts: kept
		{4.3, 153}, // within the band of 4.8
		{2.2, 70},  // another tokenizer: 32768 × 2.2 / 1024
		{2.4, 70},  // its average drifts: kept
		{3.4, 108}, // moved: followed
		{3.1, 108}, // within the band
		{2.2, 70},  // moved back past the band
	}
	for i, s := range steps {
		mu.Lock()
		ratio = s.ratio
		mu.Unlock()
		h.round(t.Context())
		if c, _ := got.last(rep.URL); c.CapacityBlocks != s.want {
			t.Errorf("step %d (ratio %v): capacity %d blocks, want %d", i, s.ratio, c.CapacityBlocks, s.want)
		}
	}
}
