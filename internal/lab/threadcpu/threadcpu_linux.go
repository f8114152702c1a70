//go:build linux

package threadcpu

import (
	"syscall"
	"time"
	"unsafe"
)

// Now is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID); ok is
// false if the clock cannot be read.
func Now() (d time.Duration, ok bool) {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
