//go:build !linux

package scale

import "time"

// threadCPU is unknown here: decisions report wall time only.
func threadCPU() (time.Duration, bool) { return 0, false }
