//go:build race

package main

// raceEnabled: the race detector slows the routers tenfold against the
// replica-sims' time, which it does not slow; TestLoRAPlacement then
// holds the mesh to beating round-robin, not to its figures, and
// TestEndToEndDisaggregated, three clusters through issue 7's chat with
// seconds of timed think and stream, is skipped (what it would check of
// the race detector, the proxy's legs, the proxy's own tests run under
// it).
const raceEnabled = true
