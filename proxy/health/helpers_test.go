package health

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/deadaddr"
)

// replicaServer is a fake replica counting its requests.
type replicaServer struct {
	*httptest.Server
	mu   sync.Mutex
	hits int
}

// newReplica serves h as a fake replica until the test ends.
func newReplica(t *testing.T, h http.HandlerFunc) *replicaServer {
	t.Helper()
	rs := &replicaServer{}
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs.mu.Lock()
		rs.hits++
		rs.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(rs.Close)
	return rs
}

func (rs *replicaServer) count() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.hits
}

// deadAddr returns a URL on which nothing listens: connections are
// refused until the test ends (internal/deadaddr).
func deadAddr(t *testing.T) string {
	t.Helper()
	return "http://" + deadaddr.Addr(t)
}

// testWait bounds every wait of these tests: a liveness bound, never a
// speed assertion.
const testWait = 60 * time.Second

// recv receives from ch within testWait.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testWait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// newLlamaCpp serves a fake llama-server until the test ends: its load
// as llama.cpp's /metrics counts it (set with the engine's set), and
// slots total slots of 1,024 tokens in /props, the only place llama.cpp
// publishes them.
func newLlamaCpp(t *testing.T, slots int) (*engineReplica, *replicaServer) {
	t.Helper()
	e := &engineReplica{metrics: "llamacpp:requests_processing %d\nllamacpp:requests_deferred %d\n"}
	props := fmt.Sprintf(`{"total_slots":%d,"default_generation_settings":{"n_ctx":1024}}`, slots)
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/props" {
			fmt.Fprint(w, props)
			return
		}
		e.serve(w, r)
	})
	return e, rep
}
