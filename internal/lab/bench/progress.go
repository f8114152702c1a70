package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// progressInterval caps redraws at 4 per second so a terminal over ssh keeps up.
const progressInterval = 250 * time.Millisecond

// startProgress redraws a one-line bar on w until the returned stop is
// called; stop draws the final state, ends the line and waits for the
// drawing goroutine to exit.
func startProgress(w io.Writer, c *collector) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				drawProgress(w, c.snapshot())
				fmt.Fprintln(w)
				return
			case <-t.C:
				drawProgress(w, c.snapshot())
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

func drawProgress(w io.Writer, s snapshot) {
	const width = 30
	filled := 0
	if s.total > 0 {
		filled = min(width, s.done*width/s.total)
	}
	fmt.Fprintf(w, "\r[%s%s] %d/%d done  %d errors  %d in flight  %s ",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		s.done, s.total, s.errs, s.inFlight, s.elapsed.Truncate(time.Second))
}
