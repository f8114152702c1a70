package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// holdView is a fakeView whose replicas' summaries hold what the proxy
// recorded and whose loads count what it began: the proxy's own writes
// steer its next decisions, as the mesh's view does.
type holdView struct {
	*fakeView
	mu       sync.Mutex
	sums     map[string]*summary.Summary
	inFlight map[string]int
	pending  map[string]float64
}

func newHoldView(t *testing.T, ids ...string) *holdView {
	t.Helper()
	v := &holdView{sums: map[string]*summary.Summary{}, inFlight: map[string]int{}, pending: map[string]float64{}}
	var rs []fakeReplica
	for _, id := range ids {
		s, err := summary.New(summary.Params{CapacityBlocks: 4096, FalsePositiveRate: 0.001}, 1)
		if err != nil {
			t.Fatal(err)
		}
		v.sums[id] = s
		rs = append(rs, fakeReplica{id: id})
	}
	v.fakeView = newFakeView([]string{"m"}, rs...)
	return v
}

func (v *holdView) PooledCandidates(model string) ([]route.Candidate, func()) {
	cands := v.Candidates(model, nil)
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range cands {
		id := cands[i].ID()
		cands[i].Summary = v.sums[id]
		cands[i].InFlight = route.Count32(v.inFlight[id])
		cands[i].PendingPrefillBlocks = v.pending[id]
	}
	return cands, func() {}
}

func (v *holdView) Record(id string, hashes []uint64) {
	v.fakeView.Record(id, hashes)
	v.sums[id].Add(hashes)
}

func (v *holdView) Begin(id string, prefill float64) (func(), func()) {
	v.mu.Lock()
	v.inFlight[id]++
	v.pending[id] += prefill
	v.mu.Unlock()
	var first, done sync.Once
	firstByte := func() {
		first.Do(func() {
			v.mu.Lock()
			v.pending[id] -= prefill
			v.mu.Unlock()
		})
	}
	return firstByte, func() {
		firstByte()
		done.Do(func() {
			v.mu.Lock()
			v.inFlight[id]--
			v.mu.Unlock()
		})
	}
}

// firstTurn is conversation i's first turn: a one-block system prompt
// (at testContract's 16 bytes) every conversation shares, then a
// document of its own, as kvmesh bench's conversations start.
func firstTurn(i int) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	b, _ := json.Marshal(struct {
		Model    string `json:"model"`
		Messages []msg  `json:"messages"`
		Stream   bool   `json:"stream"`
	}{"m", []msg{{"system", "Be brief"}, {"user", fmt.Sprintf("document %d: %s", i, strings.Repeat("words ", 4))}}, true})
	return string(b)
}

// TestFirstTurnsSharingABlockSpread: an engine that sends its headers
// before its prefill (vLLM) does not make its queued prompt "held". First
// turns sent one after another, each while the ones before wait for their
// first token, share only the system prompt's block; were the prompt
// recorded at the headers, each later one would see that block warm at
// the first replica and queue there, while the other replica sat idle.
// Recorded at the first token, they are cold and spread; the prompt is
// held once its first token came.
func TestFirstTurnsSharingABlockSpread(t *testing.T) {
	release := make(chan struct{})
	handler := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // the headers, then the prefill
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		sseChat(w, deltas(2, 4), 0)
	}
	a, b := newReplica(t, handler), newReplica(t, handler)
	view := newHoldView(t, a.URL, b.URL)
	p, srv, _ := newTestProxy(t, view, nil)
	const n = 8
	var resps []*http.Response
	for i := range n {
		// post returns at the response's headers: the request is at
		// its replica, waiting for its first token.
		resps = append(resps, post(t, t.Context(), srv.URL+"/v1/chat/completions", firstTurn(i)))
	}
	if got := len(view.recorded(a.URL)) + len(view.recorded(b.URL)); got != 0 {
		t.Errorf("%d prompts recorded before any first token, want 0", got)
	}
	if a.count() < n/4 || b.count() < n/4 {
		t.Errorf("first turns %d and %d on the two replicas, want at least %d on each", a.count(), b.count(), n/4)
	}
	close(release)
	for _, resp := range resps {
		if readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	waitCounted(t, p, epChat, n)
	if got := len(view.recorded(a.URL)) + len(view.recorded(b.URL)); got < n {
		t.Errorf("%d records after the answers, want at least %d (each prompt once it was computed)", got, n)
	}
}

// TestPredictionCountsPromptsInFlight: a prompt whose first token came
// while another sharing its first block, whose first token came before,
// is still in flight is predicted to find that block cached: the engine
// computes it once, for the first, though no summary held it yet. The
// order is the first tokens' (the engine's computing order), neither the
// router's sending order nor the headers': here the request sent first
// is accepted second but computed first, so the one sent second is the
// one predicted the block.
func TestPredictionCountsPromptsInFlight(t *testing.T) {
	sentFirst, sentSecond := firstTurn(1), firstTurn(2)
	pr, err := prompt.RenderChat([]byte(sentSecond))
	if err != nil {
		t.Fatal(err)
	}
	// sseChat reports 100 prompt tokens: this many text bytes per token
	// (as learn clamps it). Only the request sent second reports cached
	// tokens (the shared block), so the predicted tokens counted are its
	// own.
	bpt := clampBytesPerToken(float64(len(pr.Text)) / 100)
	secondAccepted, release := make(chan struct{}), make(chan struct{})
	releaseSecond, firstDone := make(chan struct{}), make(chan struct{})
	wait := func(r *http.Request, ch chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		first := strings.Contains(string(body), "document 1")
		if first && !wait(r, secondAccepted) { // accepted after the one sent second
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if !first {
			// Computed after the one sent first, which is still in
			// flight.
			if !wait(r, releaseSecond) {
				return
			}
			sseChat(w, deltas(2, 4), int(math.Round(16/bpt)))
			return
		}
		if !wait(r, release) {
			return
		}
		// Its first token, then the rest once the other has ended.
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n")
		w.(http.Flusher).Flush()
		if wait(r, firstDone) {
			sseChat(w, deltas(2, 4), -1)
		}
	})
	view := newHoldView(t, rep.URL)
	p, srv, _ := newTestProxy(t, view, nil)
	var wg sync.WaitGroup
	headed := make(chan *http.Response, 2)
	sent := time.Now()
	for i, body := range []string{sentFirst, sentSecond} {
		wg.Go(func() {
			resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", body)
			headed <- resp
		})
		// The second is sent once the first is at the replica.
		waitFor(t, fmt.Sprintf("request %d at the replica", i+1), func() bool { return rep.count() == i+1 })
	}
	// The one sent second is accepted first: its headers reach the
	// client (the router took them in) before the other's are sent.
	second := recv(t, headed, "headers")
	close(secondAccepted)
	firstResp := recv(t, headed, "headers")
	// The engine computes the prompts after it accepted them: the first
	// byte comes later after the headers than the headers after the
	// sending (acceptedFirst), as on vLLM.
	time.Sleep(2 * time.Since(sent))
	close(release)
	// The router has taken the first byte of the one sent first once
	// its client reads it.
	if _, err := io.ReadFull(firstResp.Body, make([]byte, 1)); err != nil {
		t.Fatalf("first byte: %v", err)
	}
	close(releaseSecond)
	if readAll(t, second); second.StatusCode != http.StatusOK {
		t.Errorf("status %d", second.StatusCode)
	}
	close(firstDone)
	if readAll(t, firstResp); firstResp.StatusCode != http.StatusOK {
		t.Errorf("status %d", firstResp.StatusCode)
	}
	waitGroup(t, &wg, "both requests")
	waitCounted(t, p, epChat, 2)
	// The shared block and half the block after it (no tail share
	// learnt yet).
	want := (1 + tailPrior) * 16 / bpt
	if got := testutil.ToFloat64(p.m.predictedCached); math.Abs(got-want) > 1e-6 {
		t.Errorf("predicted %v cached tokens, want %v (the block the one computed first computes for it, and half the next)", got, want)
	}
	p.flight.mu.Lock()
	defer p.flight.mu.Unlock()
	if n := len(p.flight.by); n != 0 {
		t.Errorf("%d replicas still have blocks in flight after both ended, want 0", n)
	}
}
