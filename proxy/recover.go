package proxy

import (
	"bytes"
	"fmt"
	"net/http"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
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

// Where a panic was recovered (the label of kvmesh_recovered_panics_total).
const (
	panicHandler    = "handler"
	panicStreamLoop = "stream_loop"
)

func newPanicCounter(f promauto.Factory) *prometheus.CounterVec {
	c := f.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_recovered_panics_total",
		Help: "Panics the router recovered from, by where: in a request's handler (the client got a 500, or its stream was aborted) or on a stream loop (that stream was aborted; the loop served on).",
	}, []string{"where"})
	c.WithLabelValues(panicHandler)
	c.WithLabelValues(panicStreamLoop)
	return c
}

// stackLines is how many lines of a recovered panic's stack are logged:
// the panic, the goroutine's header and the innermost frames.
const stackLines = 24

// headOfStack returns the first n lines of stack.
func headOfStack(stack []byte, n int) string {
	i := 0
	for range n {
		j := bytes.IndexByte(stack[i:], '\n')
		if j < 0 {
			return string(stack)
		}
		i += j + 1
	}
	return string(stack[:i])
}

// recovered counts and logs (rate-limited) a panic recovered where.
func (p *Proxy) recovered(where string, v any) {
	p.m.panics.WithLabelValues(where).Inc()
	if ok, suppressed := p.panicLog.Allow(); ok {
		p.log.Error("recovered from a panic", "where", where, "panic", fmt.Sprint(v),
			"suppressed_since_last", suppressed, "stack", headOfStack(debug.Stack(), stackLines))
	}
}

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
func (p *Proxy) contain(t *trackedWriter) {
	v := recover()
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
	p.recovered(panicHandler, v)
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
