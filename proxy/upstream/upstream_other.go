//go:build !unix

package upstream

// idleChecks: elsewhere pooled connections are reused unchecked (as
// net/http's would be between its reader's polls); idleOpen is never
// called.
const idleChecks = false

func idleOpen(uintptr) bool { return true }
