//go:build !unix

package threadcpu

import "time"

// Process is not read here: ok is false.
func Process() (d time.Duration, ok bool) { return 0, false }
