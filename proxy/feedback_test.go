package proxy

import (
	"bufio"
	"fmt"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestRecordOnlyWhenAccepted: a prompt enters a replica's summary only
// once that replica accepted the request; a refused or failed attempt
// leaves no false "held".
func TestRecordOnlyWhenAccepted(t *testing.T) {
	tests := []struct {
		name       string
		first      http.HandlerFunc // the replica that claims the prefix
		wantFirst  int              // records at it
		wantSecond int              // records at the fallback
		status     int
	}{
		{"accepted", func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "fine", 0) }, 2, 0, 200},
		{"503 then retried", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusServiceUnavailable) }, 0, 2, 200},
		{"400 passed through", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "bad", http.StatusBadRequest) }, 0, 0, 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			first := newReplica(t, tc.first)
			second := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from the second", 0) })
			view := newFakeView([]string{"m"}, fakeReplica{id: first.URL, match: 5}, fakeReplica{id: second.URL})
			_, srv, _ := newTestProxy(t, view, nil)
			resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
			readAll(t, resp)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			view.waitDone(t)
			if tc.wantSecond > 0 {
				view.waitDone(t)
			}
			if got := len(view.recorded(first.URL)); got != tc.wantFirst {
				t.Errorf("records at the first replica %d, want %d", got, tc.wantFirst)
			}
			if got := len(view.recorded(second.URL)); got != tc.wantSecond {
				t.Errorf("records at the second replica %d, want %d", got, tc.wantSecond)
			}
		})
	}
}

// TestForgetBeyondReported: when the engine reports fewer cached tokens
// than the summary predicted, the blocks beyond the report (and a block
// of slack, unless it reported under a block) are forgotten, the prompt and answer are recorded again after
// that, and the error lands in the histogram.
func TestForgetBeyondReported(t *testing.T) {
	body := chatBody("m", true, longPrompt)
	prompt, err := prompt.RenderChat([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	hashes := testContract.AppendHashes(nil, testContract.Root("m", ""), prompt.Text)
	// sseChat reports 100 prompt tokens: this many text bytes per token.
	bpt := float64(len(prompt.Text)) / 100
	const match = 12
	tests := []struct {
		name       string
		cached     int
		wantForget []uint64
	}{
		{"nothing cached", 0, hashes[:match]},
		// The start token alone (llama.cpp's full miss): under a block.
		{"one token cached", 1, hashes[:match]},
		{"half cached", int(6*16/bpt) + 1, hashes[7:match]},
		{"all cached", int(match*16/bpt) + 1, nil},
		{"more than predicted", 100, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				sseChat(w, []string{"an answer of a few blocks, ", "streamed"}, tc.cached)
			})
			view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL, match: match})
			p, srv, _ := newTestProxy(t, view, nil)
			resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", body)
			readAll(t, resp)
			view.waitDone(t)
			forgets := view.forgotten(rep.URL)
			if tc.wantForget == nil {
				if len(forgets) != 0 {
					t.Fatalf("forgot %d times, want none", len(forgets))
				}
			} else if len(forgets) != 1 || !slices.Equal(forgets[0], tc.wantForget) {
				t.Fatalf("forgets %v, want one of %d blocks", forgets, len(tc.wantForget))
			}
			recs := view.recorded(rep.URL)
			if len(recs) != 2 || !slices.Equal(recs[0], hashes) || len(recs[1]) <= len(hashes) {
				t.Fatalf("records %d, want the prompt, then prompt + answer", len(recs))
			}
			var m dto.Metric
			if err := p.m.predictionError.Write(&m); err != nil {
				t.Fatal(err)
			}
			h := m.GetHistogram()
			// The match and, as nothing was learnt yet, half the block
			// after it.
			want := match + tailPrior - float64(tc.cached)*bpt/16
			if h.GetSampleCount() != 1 || h.GetSampleSum() < want-1e-9 || h.GetSampleSum() > want+1e-9 {
				t.Errorf("prediction error count %d sum %v, want 1 and %v", h.GetSampleCount(), h.GetSampleSum(), want)
			}
		})
	}
}

// TestLearnAfterClientLeft: a client that leaves right after [DONE],
// before the replica's response has ended, does not cost the router what
// the response taught: the prompt and answer are recorded and the
// cached-token report is checked, on both relay paths.
func TestLearnAfterClientLeft(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("no stream loop %v", off), func(t *testing.T) {
			rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				sseChat(w, []string{"an answer of a few blocks, ", "streamed to its end"}, 0)
				w.(http.Flusher).Flush()
				// The response does not end until the router lets go.
				select {
				case <-r.Context().Done():
				case <-time.After(testWait):
				}
			})
			view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL, match: 4})
			p, srv, _ := newTestProxy(t, view, func(c *Config) { c.NoStreamLoop = off })
			body := chatBody("m", true, longPrompt)
			resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", body)
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() && sc.Text() != "data: [DONE]" {
			}
			resp.Body.Close() // gone, with the replica's response still open
			view.waitDone(t)
			pr, err := prompt.RenderChat([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			hashes := testContract.AppendHashes(nil, testContract.Root("m", ""), pr.Text)
			recs := view.recorded(rep.URL)
			if len(recs) != 2 || !slices.Equal(recs[0], hashes) || len(recs[1]) <= len(hashes) {
				t.Fatalf("records %d, want the prompt, then prompt + answer", len(recs))
			}
			if got := len(view.forgotten(rep.URL)); got != 1 {
				t.Errorf("forgot %d times, want once (the replica reported nothing cached)", got)
			}
			if got := testutil.ToFloat64(p.m.promptTokens); got != 100 {
				t.Errorf("prompt tokens %v, want the replica's 100", got)
			}
		})
	}
}

// TestHopCountsTheOwnersMatch: a forwarded request's predicted cached
// tokens (and its correction) count the owner's summary of the replica,
// not the entry router's copy, which lags it: here the copy knew nothing
// of a prefix the owner's summary holds and the engine reported cached.
func TestHopCountsTheOwnersMatch(t *testing.T) {
	body := chatBody("m", false, longPrompt)
	pr, err := prompt.RenderChat([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	const match = 6
	// jsonChat reports 100 prompt tokens: this many text bytes per token.
	bpt := float64(len(pr.Text)) / 100
	cached := int(match * 16 / bpt)
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "ok", cached) })
	owner, ownerSrv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL, match: match}), func(c *Config) { c.HopKey = testHopKey })
	_, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL, owner: ownerSrv.URL, match: 0}), func(c *Config) { c.HopKey = testHopKey })
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", body)
	if readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	waitCounted(t, owner, epChat, 1)
	// The match and half the block after it (nothing learnt yet).
	want := (match + tailPrior) * 16 / bpt
	if got := testutil.ToFloat64(owner.m.predictedCached); math.Abs(got-want) > 1e-6 {
		t.Errorf("the owner predicted %v cached tokens, want %v (its own match of %d blocks)", got, want, match)
	}
}
