//go:build race

package main

// raceEnabled: the race detector slows the routers tenfold against the
// replica-sims' time, which it does not slow; TestLoRAPlacement then
// holds the mesh to beating round-robin, not to its figures.
const raceEnabled = true
