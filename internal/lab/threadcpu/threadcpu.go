// Package threadcpu reads the calling thread's CPU clock. With the
// goroutine locked to its thread (runtime.LockOSThread), the difference
// of two readings is the CPU the work between them took, without the time
// the thread waited for a core: on a loaded 2-core machine that separates
// what a decision costs from the queue it waited in. The benchmarks of
// route and mesh and the scale harness read it.
package threadcpu

import "time"

// OrWall is Now where the thread's clock is read, else the wall clock
// (a stand-in that still times the work, waits included).
func OrWall() time.Duration {
	if d, ok := Now(); ok {
		return d
	}
	return time.Duration(time.Now().UnixNano())
}
