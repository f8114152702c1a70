// Package deadaddr gives tests an address on 127.0.0.1 where TCP
// connections are refused, and stay refused while the test runs.
//
// Why not a listener closed at once: its port goes back to the kernel,
// which hands it to the next listener on 127.0.0.1:0, of the same test or
// of another test binary running beside it (go test ./... runs packages
// in parallel). Under load that happened: a "dead" replica answered as
// the test's good one (proxy's TestRetryBeforeFirstByte), or as another
// binary's listener that accepted and never answered, a 300 s wait
// (bench's TestRunErrorKinds). Here the port stays bound to a socket that
// never listens until the test ends.
package deadaddr

import "testing"

// Addr returns "127.0.0.1:port" where connections are refused until the
// test (and its cleanups) end.
func Addr(t testing.TB) string {
	t.Helper()
	return addr(t)
}
