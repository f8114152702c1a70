package sim

import (
	"context"
	"testing"
	"time"
)

// With summaries sized for 4× the engines' cache, the engines' reports
// drive the owners' corrections: misses are corrected, and some show the
// newer generation stale and cut it. Without the feedback loop nothing is
// corrected.
func TestFeedbackLoopCutsOversizedSummaries(t *testing.T) {
	reqs := conversations(60, 6, 6, 100*time.Millisecond)
	run := func(correction string, capErr float64) PolicyReport {
		cfg := testConfig()
		cfg.Replicas, cfg.Routers, cfg.CacheBlocks = 4, 2, 300
		cfg.CapacityError, cfg.Correction = capErr, correction
		cfg.Policies = []string{PolicyMesh}
		r, err := Run(context.Background(), cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return policy(t, r, PolicyMesh)
	}
	none, forget, cut := run(CorrectionNone, 4), run(CorrectionForget, 4), run(CorrectionCut, 4)
	exact := run(CorrectionCut, 1)
	t.Logf("hit: none %.3f forget %.3f cut %.3f (correct size, cut %.3f); cut: %d corrected, %d older, %d both",
		none.HitRatio, forget.HitRatio, cut.HitRatio, exact.HitRatio, cut.Corrections, cut.CutsOlder, cut.CutsBoth)
	if none.Corrections != 0 || forget.Corrections == 0 || forget.CutsOlder+forget.CutsBoth != 0 {
		t.Errorf("none corrected %d, forget %d (cuts %d)", none.Corrections, forget.Corrections, forget.CutsOlder+forget.CutsBoth)
	}
	if cut.Corrections == 0 || cut.CutsOlder+cut.CutsBoth == 0 {
		t.Errorf("oversized summaries: %d corrections, %d cuts", cut.Corrections, cut.CutsOlder+cut.CutsBoth)
	}
}
