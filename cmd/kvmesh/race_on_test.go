//go:build race

package main

// raceEnabled: TestEndToEndDisaggregated runs three clusters through
// issue 7's chat, seconds of timed think and stream; the race detector
// would make it a minute of CI's -race step, and what it would check,
// the proxy's legs, proxy's own tests run under it.
const raceEnabled = true
