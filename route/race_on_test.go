//go:build race

package route

// raceEnabled: the race detector slows TestPickSkipsOnlyWhatCannotWin
// tenfold; it runs fewer rounds under it (what it checks there is that
// Pick shares nothing, not more random views).
const raceEnabled = true
