package proxy

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/route"
)

// pooledFakeView is a fakeView that lends its candidates as the mesh
// does, and counts what it lent and what came back.
type pooledFakeView struct {
	*fakeView
	mu       sync.Mutex
	lent     int
	released int
}

func (v *pooledFakeView) PooledCandidates(model string) ([]route.Candidate, func()) {
	v.mu.Lock()
	v.lent++
	v.mu.Unlock()
	once := false
	return v.Candidates(model, nil), func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if once {
			panic("candidates released twice")
		}
		once = true
		v.released++
	}
}

// TestPooledCandidatesReturned: every request that borrows candidates
// gives them back exactly once, whether it is served at once, after a
// failed attempt, or fails on every replica — a buffer not returned is
// 200 KB a request at a thousand replicas.
func TestPooledCandidatesReturned(t *testing.T) {
	ok := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "hi", 0) })
	tests := []struct {
		name     string
		replicas []fakeReplica
		status   int
	}{
		{"served", []fakeReplica{{id: ok.URL}}, http.StatusOK},
		{"served after a refused attempt", []fakeReplica{{id: deadAddr(t), match: 4}, {id: ok.URL}}, http.StatusOK},
		{"every attempt refused", []fakeReplica{{id: deadAddr(t)}, {id: deadAddr(t)}}, http.StatusBadGateway},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := &pooledFakeView{fakeView: newFakeView([]string{"m"}, tc.replicas...)}
			_, srv, _ := newTestProxy(t, v, nil)
			const n = 3
			for range n {
				resp := post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
				body := readAll(t, resp)
				if resp.StatusCode != tc.status {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
				}
			}
			v.mu.Lock()
			defer v.mu.Unlock()
			if v.lent != n || v.released != n {
				t.Fatalf("lent %d, released %d; want %d each", v.lent, v.released, n)
			}
		})
	}
}
