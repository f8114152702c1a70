package proxy

import (
	"net/http"
	"sync"

	"github.com/kvmesh/kvmesh/internal/panics"
)

// A panic in the router's own code (an answer extractor meeting input it
// did not expect, a bug in a handler) must cost one request, never the
// process nor the other requests: net/http contains a handler's panic but
// answers it by closing the client's connection with nothing sent, and a
// panic on a stream loop's goroutine (streamloop_linux.go), which no
// net/http recovers, would end the process with every stream it relays.
// So the proxy recovers both: ServeHTTP answers an OpenAI-shaped 500 when
// nothing was written yet and aborts the response (as net/http does for
// a failed stream) when the head was sent; the loop ends the one stream
// whose code panicked and serves the others on. Each is counted in
// kvmesh_recovered_panics_total{where} and logged a few times a second at
// most, with the first lines of the stack.

// Where a panic was recovered (the label of kvmesh_recovered_panics_total,
// internal/panics).
const (
	panicHandler    = panics.Handler
	panicStreamLoop = panics.StreamLoop
	panicAdmin      = panics.Admin
)

// recovered counts and logs (rate-limited) a panic recovered where.
func (p *Proxy) recovered(where string, v any) { p.panics.Recovered(where, v) }

// trackedWriter is the ResponseWriter every handler of ServeHTTP gets: it
// knows whether the response's head is written, which is what decides how
// a panic is answered. They are pooled, so a request allocates none.
type trackedWriter struct {
	http.ResponseWriter
	wrote bool
}

var trackedWriters = sync.Pool{New: func() any { return new(trackedWriter) }}

// WriteHeader implements http.ResponseWriter. An informational head
// (103 Early Hints, hop.go) still lets a final status follow.
func (t *trackedWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		t.wrote = true
	}
	t.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter (a Write writes the head first).
func (t *trackedWriter) Write(b []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (t *trackedWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// unwrapTracked returns the writer under ServeHTTP's tracking, which the
// stream loop may write around (its head is written through it first).
func unwrapTracked(w http.ResponseWriter) http.ResponseWriter {
	if t, ok := w.(*trackedWriter); ok {
		return t.ResponseWriter
	}
	return w
}

// contain is ServeHTTP's deferred recovery. It runs after every deferred
// release of the handler (load counts, hop books, pooled buffers), which
// ran as the panic unwound their frames.
func (p *Proxy) contain(t *trackedWriter) { containHTTP(p.panics, panicHandler, t, recover()) }

// ContainAdmin serves h (the admin server's handler: /metrics,
// /debug/mesh, the status page) with its panics contained as the API's
// are: an OpenAI-shaped 500 when nothing was written yet, an aborted
// response otherwise, counted as where="admin". net/http would contain
// them too, but by closing the connection with nothing sent and a stack
// in the log per request.
func (p *Proxy) ContainAdmin(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := trackedWriters.Get().(*trackedWriter)
		t.ResponseWriter, t.wrote = w, false
		defer func() { containHTTP(p.panics, panicAdmin, t, recover()) }()
		h.ServeHTTP(t, r)
	})
}

// containHTTP answers a handler's recovered panic v (nil: none, and t
// goes back to its pool) and counts it in rec as where.
func containHTTP(rec *panics.Recorder, where string, t *trackedWriter, v any) {
	if v == nil {
		t.ResponseWriter = nil
		trackedWriters.Put(t)
		return
	}
	if v == http.ErrAbortHandler {
		// The proxy's own signal for a response it cannot finish
		// (relay's mid-stream failure): not a bug.
		panic(v)
	}
	rec.Recovered(where, v)
	if t.wrote {
		// Bytes of a success were sent: only a broken connection tells
		// the client the response is not whole.
		panic(http.ErrAbortHandler)
	}
	h := t.Header()
	for k := range h {
		delete(h, k) // whatever the handler meant to send with its answer
	}
	h.Set("Connection", "close") // the request's body may be unread
	writeError(t.ResponseWriter, http.StatusInternalServerError, "internal error in the router; the request was not completed")
	// Not pooled: a goroutine of the handler may still hold it.
}
