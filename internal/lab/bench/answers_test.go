package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
)

// TestAnswerTokensFixed: σ 0 asks the median of every turn, as before
// --answer-sigma.
func TestAnswerTokensFixed(t *testing.T) {
	cfg := ConvConfig{AnswerTokens: 48, Seed: 7}
	for c := range 5 {
		for turn := range 5 {
			if got := answerTokens(cfg, c, turn); got != 48 {
				t.Fatalf("conversation %d turn %d: %d, want 48", c, turn, got)
			}
		}
	}
}

// TestAnswerTokensLognormal: the draws are a function of the seed, the
// conversation and the turn; they vary; they stay in [1, 16 × median];
// their median is the median asked for (a tolerant bound over many
// draws); and a larger σ has the heavier tail.
func TestAnswerTokensLognormal(t *testing.T) {
	const median = 32
	draw := func(seed uint64, sigma float64) []int {
		cfg := ConvConfig{AnswerTokens: median, AnswerSigma: sigma, Seed: seed}
		var out []int
		for c := range 400 {
			for turn := range 10 {
				out = append(out, answerTokens(cfg, c, turn))
			}
		}
		return out
	}
	a, again, other := draw(1, 1), draw(1, 1), draw(2, 1)
	if !slices.Equal(a, again) {
		t.Fatal("one seed drew different lengths")
	}
	if slices.Equal(a, other) {
		t.Fatal("two seeds drew the same lengths")
	}
	for i, v := range a {
		if v < 1 || v > 16*median {
			t.Fatalf("draw %d = %d outside [1, %d]", i, v, 16*median)
		}
	}
	s := slices.Sorted(slices.Values(a))
	if m := s[len(s)/2]; m < median*85/100 || m > median*115/100 {
		t.Fatalf("median %d, want about %d", m, median)
	}
	if s[0] == s[len(s)-1] {
		t.Fatal("σ 1 drew one length only")
	}
	// exp(2.326σ) is the p99 over the median: ~10x at σ 1, ~3.2x at σ 0.5.
	p99 := func(v []int) int { s := slices.Sorted(slices.Values(v)); return s[len(s)*99/100] }
	if hi, lo := p99(a), p99(draw(1, 0.5)); hi <= lo || hi < 6*median || lo > 5*median {
		t.Fatalf("p99 at σ 1: %d, at σ 0.5: %d (median %d)", hi, lo, median)
	}
	// A huge σ is clamped at both ends.
	huge := slices.Sorted(slices.Values(draw(1, 20)))
	if huge[0] != 1 || huge[len(huge)-1] != 16*median {
		t.Fatalf("σ 20 drew [%d, %d], want clamped to [1, %d]", huge[0], huge[len(huge)-1], 16*median)
	}
}

// TestConversationsSendAnswerLengths: every turn asks the max_tokens
// answerTokens draws for it, and ignore_eos when asked, whichever front
// end and client sends it; two runs of one seed ask the same.
func TestConversationsSendAnswerLengths(t *testing.T) {
	type asked struct {
		MaxTokens int   `json:"max_tokens"`
		IgnoreEOS *bool `json:"ignore_eos"`
	}
	var mu sync.Mutex
	got := map[string]asked{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a asked
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		mu.Lock()
		got[r.Header.Get("X-Request-Id")] = a
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", a.MaxTokens)
	}))
	defer srv.Close()
	other := httptest.NewServer(srv.Config.Handler)
	defer other.Close()

	run := func(clients int, ignoreEOS bool) (ConvResult, map[string]asked) {
		clear(got)
		cfg := ConvConfig{
			Frontends: []string{srv.URL, other.URL}, Model: "m", Conversations: 6, Turns: 4, Clients: clients,
			Think: -1, SystemWords: 5, DocumentWords: 5, TurnWords: 3, AnswerTokens: 20, AnswerSigma: 1,
			IgnoreEOS: ignoreEOS, Seed: 3, RequestIDs: "r", Progress: io.Discard,
		}
		res, err := RunConversations(t.Context(), "lengths", cfg)
		if err != nil || res.Turns != 24 {
			t.Fatalf("turns %d err %v", res.Turns, err)
		}
		mu.Lock()
		defer mu.Unlock()
		for c := range 6 {
			for turn := range 4 {
				a, ok := got[RequestID("r", c, turn)]
				if want := answerTokens(cfg, c, turn); !ok || a.MaxTokens != want {
					t.Fatalf("conversation %d turn %d asked %+v, want max_tokens %d", c, turn, a, want)
				}
				if (a.IgnoreEOS != nil) != ignoreEOS || (ignoreEOS && !*a.IgnoreEOS) {
					t.Fatalf("conversation %d turn %d: ignore_eos %v, want %v", c, turn, a.IgnoreEOS, ignoreEOS)
				}
			}
		}
		return res, maps.Clone(got)
	}
	res, first := run(2, true)
	_, second := run(5, false)
	distinct := map[int]bool{}
	for id, a := range first {
		if second[id].MaxTokens != a.MaxTokens {
			t.Fatalf("%s: max_tokens %d, then %d", id, a.MaxTokens, second[id].MaxTokens)
		}
		distinct[a.MaxTokens] = true
	}
	if len(distinct) < 2 {
		t.Fatalf("σ 1 asked one length only: %v", distinct)
	}
	for _, r := range res.Requests {
		if r.MaxTokens != first[r.ID].MaxTokens || r.CompletionTokens != int64(r.MaxTokens) {
			t.Fatalf("record %+v, asked %+v", r, first[r.ID])
		}
	}
}
