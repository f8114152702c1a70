package gcpace

import (
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		live, headroom uint64
		max, want      int
	}{
		{0, 32 * mb, 400, 400},        // nothing live yet
		{4 * mb, 32 * mb, 400, 400},   // small heap: the most
		{16 * mb, 32 * mb, 400, 300},  // goal 64 MB: 32 over GOGC=100's 32
		{64 * mb, 32 * mb, 400, 150},  // goal 160 MB: 32 over 128
		{1 << 40, 32 * mb, 400, 100},  // huge heap: the default
		{4 * mb, 32 * mb, 100, 100},   // max 100: the default
		{4 * mb, 0, 400, 100},         // no headroom: the default
		{10 * mb, 32 * mb, 1000, 420}, // 100 + 3200/10
		{3 * mb, 1 * mb, 400, 133},    // rounds down: within the headroom
		{8 * mb, 32 * mb, 50, 100},    // max under 100 is 100
	} {
		if got := Percent(tc.live, tc.headroom, tc.max); got != tc.want {
			t.Errorf("Percent(%d MB live, %d MB headroom, max %d) = %d, want %d", tc.live/mb, tc.headroom/mb, tc.max, got, tc.want)
		}
		// The goal never exceeds GOGC=100's by more than the headroom.
		got := Percent(tc.live, tc.headroom, tc.max)
		if extra := tc.live * uint64(got-100) / 100; extra > tc.headroom {
			t.Errorf("Percent(%d, %d, %d) = %d: %d bytes over GOGC=100's goal", tc.live, tc.headroom, tc.max, got, extra)
		}
	}
}

// Start sets the percent at once and Stop gives the previous one back.
func TestStartStop(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	p := Start(1<<40, 400, time.Hour)
	if got := debug.SetGCPercent(400); got != 400 {
		t.Errorf("percent after Start = %d, want 400", got)
	}
	p.Stop()
	if got := debug.SetGCPercent(prev); got != 100 {
		t.Errorf("percent after Stop = %d, want the previous 100", got)
	}
}
