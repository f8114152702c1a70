package threadcpu

import (
	"runtime"
	"testing"
	"time"
)

// Work on a locked thread advances its clock; sleeping does not advance it
// by the sleep.
func TestNowCountsWorkNotSleep(t *testing.T) {
	if _, ok := Now(); !ok {
		t.Skip("no thread CPU clock on " + runtime.GOOS)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c0, _ := Now()
	x := 0
	for i := 0; i < 20_000_000; i++ {
		x += i ^ x
	}
	c1, _ := Now()
	if c1 <= c0 || x == 42 {
		t.Fatalf("thread clock did not advance over work: %v -> %v", c0, c1)
	}
	time.Sleep(200 * time.Millisecond)
	c2, _ := Now()
	if c2-c1 >= 150*time.Millisecond {
		t.Fatalf("thread clock advanced %v over a 200 ms sleep", c2-c1)
	}
}
