//go:build unix

package threadcpu

import (
	"syscall"
	"time"
)

// Process is the whole process's CPU time, user and system (getrusage);
// ok is false if it cannot be read. Benchmarks that count what a
// request costs across all of a server's threads read it.
func Process() (d time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
