package replicasim

import (
	"context"
	"net/http"
	"sync"
)

// freezer is the replica's stall switch, for tests of a router's stall
// detection: a frozen engine keeps answering /health, /v1/models and
// /metrics (its HTTP server is fine) but makes no progress: no prefill
// completes, no token is generated, no counter moves, so the requests it
// holds get nothing more and new ones get nothing at all, as when an
// engine's scheduler is wedged. It thaws on POST /debug/resume.
type freezer struct {
	mu     sync.Mutex
	thawed chan struct{} // nil while running; closed when a freeze ends
	// after: freeze once this many generation requests were admitted
	// (Config.StallAfter; 0: never by itself).
	after, admitted int
}

// admit counts one more generation request, freezing the engine when it
// is the one Config.StallAfter names.
func (f *freezer) admit() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.admitted++
	if f.after > 0 && f.admitted == f.after {
		f.freezeLocked()
	}
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.freezeLocked()
}

func (f *freezer) freezeLocked() {
	if f.thawed == nil {
		f.thawed = make(chan struct{})
	}
}

func (f *freezer) resume() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thawed != nil {
		close(f.thawed)
		f.thawed = nil
	}
}

// frozen reports whether the engine is frozen now.
func (f *freezer) frozen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.thawed != nil
}

// wait blocks while the engine is frozen, until it thaws or ctx ends.
func (f *freezer) wait(ctx context.Context) error {
	f.mu.Lock()
	c := f.thawed
	f.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// serveFreeze serves POST /debug/stall and POST /debug/resume.
func (s *Server) serveFreeze(freeze bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if freeze {
			s.freeze.freeze()
			s.logger.Warn("engine frozen: no progress until POST /debug/resume")
		} else {
			s.freeze.resume()
			s.logger.Info("engine resumed")
		}
		w.WriteHeader(http.StatusOK)
	}
}
