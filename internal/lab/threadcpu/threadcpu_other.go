//go:build !linux

package threadcpu

import "time"

// Now is not read here: ok is false.
func Now() (d time.Duration, ok bool) { return 0, false }
