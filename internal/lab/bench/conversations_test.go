package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// convServer is a fake replica that checks each turn's history: the
// previous turns' questions and the answers it gave, in order. It reports
// as cached the prompt tokens of the history it has seen before.
type convServer struct {
	mu      sync.Mutex
	answers map[string]string // rendered history prefix -> answer given
	bad     []string
	hits    int
}

func (s *convServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	s.mu.Lock()
	s.hits++
	msgs := req.Messages
	var prefix strings.Builder
	cached := 0
	for i, m := range msgs {
		if m.Role == "assistant" {
			// The answer must be the one given to exactly this history.
			if want := s.answers[prefix.String()]; want != m.Content {
				s.bad = append(s.bad, fmt.Sprintf("turn %d: history answer %q, want %q", i, m.Content, want))
			}
			cached = prefix.Len() + len(m.Content)
		}
		prefix.WriteString(m.Role + ":" + m.Content + "|")
	}
	answer := fmt.Sprintf("answer %d", s.hits)
	s.answers[prefix.String()] = answer
	s.mu.Unlock()
	if msgs[0].Role != "system" || msgs[len(msgs)-1].Role != "user" || !req.Stream || !req.StreamOptions.IncludeUsage {
		http.Error(w, "bad shape", 400)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, part := range strings.SplitAfter(answer, " ") {
		b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": part}}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\ndata: [DONE]\n\n", prefix.Len(), cached)
}

func TestRunConversations(t *testing.T) {
	srv := &convServer{answers: map[string]string{}}
	a := httptest.NewServer(srv)
	defer a.Close()
	b := httptest.NewServer(srv)
	defer b.Close()
	res, err := RunConversations(t.Context(), "fake", ConvConfig{
		Frontends: []string{a.URL, b.URL}, Model: "m", Conversations: 5, Turns: 3, Clients: 2,
		Think: -1, SystemWords: 20, DocumentWords: 30, TurnWords: 5, AnswerTokens: 4, Progress: io.Discard,
		RequestIDs: "run",
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(srv.bad) > 0 {
		t.Fatalf("histories: %v", srv.bad)
	}
	if res.Turns != 15 || res.Errors != 0 || res.ConversationsFinished != 5 || srv.hits != 15 {
		t.Fatalf("turns %d errors %d finished %d hits %d", res.Turns, res.Errors, res.ConversationsFinished, srv.hits)
	}
	if res.FirstTurnCachedShare != 0 || res.FollowupCachedShare <= 0.5 || res.FollowupCachedShare >= 1 {
		t.Fatalf("cache shares: first %v follow-up %v", res.FirstTurnCachedShare, res.FollowupCachedShare)
	}
	if res.TTFTP50Ms <= 0 || res.TTFTP99Ms < res.TTFTP50Ms {
		t.Fatalf("ttft p50 %v p99 %v", res.TTFTP50Ms, res.TTFTP99Ms)
	}
	checkTurnRecords(t, res, 5, 3, "run")
}

// checkTurnRecords: one record per turn, in the order sent, each turn of
// each conversation once, its turns in order, named as RequestID names
// it, and the records' tokens add up to the run's follow-up totals.
func checkTurnRecords(t *testing.T, res ConvResult, convs, turns int, prefix string) {
	t.Helper()
	if len(res.Requests) != convs*turns {
		t.Fatalf("%d turn records, want %d", len(res.Requests), convs*turns)
	}
	seen := map[[2]int]bool{}
	last := map[int]float64{}
	var prompt, cached int64
	for i, r := range res.Requests {
		if i > 0 && r.SentMs < res.Requests[i-1].SentMs {
			t.Fatalf("record %d sent at %v ms, before the previous one's %v", i, r.SentMs, res.Requests[i-1].SentMs)
		}
		if seen[[2]int{r.Conversation, r.Turn}] || r.Turn != len(filterConv(res.Requests[:i], r.Conversation)) {
			t.Fatalf("record %d: conversation %d turn %d out of order or twice", i, r.Conversation, r.Turn)
		}
		seen[[2]int{r.Conversation, r.Turn}] = true
		if r.Turn > 0 && r.SentMs < last[r.Conversation] {
			t.Fatalf("conversation %d turn %d sent at %v ms, before its previous turn ended (%v)", r.Conversation, r.Turn, r.SentMs, last[r.Conversation])
		}
		last[r.Conversation] = r.EndMs
		if r.TTFTMs <= 0 || r.FirstChunkMs <= 0 || r.FirstChunkMs > r.TTFTMs || r.EndMs < r.SentMs+r.TTFTMs || r.Error != "" || r.PromptTokens <= 0 {
			t.Fatalf("record %d: %+v", i, r)
		}
		if want := RequestID(prefix, r.Conversation, r.Turn); r.ID != want {
			t.Fatalf("record %d id %q, want %q", i, r.ID, want)
		}
		if r.Turn > 0 {
			prompt += r.PromptTokens
			cached += r.CachedTokens
		}
	}
	if prompt != res.FollowupPromptTokens || cached != res.FollowupCachedTokens {
		t.Fatalf("records' follow-up tokens %d/%d, the run's %d/%d", cached, prompt, res.FollowupCachedTokens, res.FollowupPromptTokens)
	}
}

func filterConv(rs []TurnRecord, c int) []TurnRecord {
	var out []TurnRecord
	for _, r := range rs {
		if r.Conversation == c {
			out = append(out, r)
		}
	}
	return out
}

// TestConversationStopsAtError: a failed turn ends its conversation (the
// next turn would lack its answer) and is counted by kind.
func TestConversationStopsAtError(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	res, err := RunConversations(t.Context(), "down", ConvConfig{Frontends: []string{srv.URL}, Model: "m", Conversations: 3, Turns: 4, Clients: 3, Think: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Turns != 0 || res.Errors != 3 || res.ErrorsByKind["http_503"] != 3 || n != 3 {
		t.Fatalf("turns %d errors %v requests %d", res.Turns, res.ErrorsByKind, n)
	}
}

func TestConvTextShape(t *testing.T) {
	c := ConvConfig{Conversations: 2, Turns: 3}
	c.defaults()
	tx := newConvText(c)
	if n := len(strings.Fields(tx.system)); n < 250 || n > 260 {
		t.Errorf("system prompt %d words", n)
	}
	if n := len(strings.Fields(tx.documents[1])); n < 600 || n > 605 {
		t.Errorf("document %d words", n)
	}
	if tx.documents[0] == tx.documents[1] || len(tx.questions[1]) != 3 || len(strings.Fields(tx.questions[1][2])) != 30 {
		t.Errorf("documents or questions wrong")
	}
	if again := newConvText(c); again.documents[1] != tx.documents[1] {
		t.Error("text is not deterministic")
	}
}

func TestParseStatCPU(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1234 (haproxy) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 130 0 0 20 0 2 0 100 0 0", 3800 * time.Millisecond, true},
		{"77 (a b) c)) R 1 77 77 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 1 0 0", 30 * time.Millisecond, true},
		{"77 (x) R 1 2", 0, false},
		{"garbage", 0, false},
	}
	for _, tc := range tests {
		got, err := parseStatCPU([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%q: %v %v, want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestOverheadAgainstInstantReplica runs the overhead benchmark briefly
// with the instant replica as both the direct target and a "front end".
func TestOverheadAgainstInstantReplica(t *testing.T) {
	rep := httptest.NewServer(InstantReplica("m", 0))
	defer rep.Close()
	res, err := RunOverhead(t.Context(), OverheadConfig{
		Direct: rep.URL, Targets: []Target{{Name: "same", URL: rep.URL, PID: os.Getpid()}}, Model: "m",
		Concurrency: []int{2}, Round: 50 * time.Millisecond, Rounds: 2, Streams: 3, StreamTokens: 20, StreamConcurrency: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 2 || res.Rows[1].RPS <= 0 || res.Rows[1].Errors != 0 || len(res.Rows[1].RPSRounds) != 2 {
		t.Fatalf("rows %+v", res.Rows)
	}
	// The target is this process, which served every request of the round.
	if res.Rows[0].CPUUsPerReq != 0 || res.Rows[1].CPUUsPerReq <= 0 {
		t.Fatalf("CPU per request: direct %v (no PID), same %v", res.Rows[0].CPUUsPerReq, res.Rows[1].CPUUsPerReq)
	}
	// Three streams over two rounds: 2 + 1, folded into one line.
	if len(res.Streams) != 1 || res.Streams[0].Errors != 0 || res.Streams[0].Streams != 3 ||
		res.Streams[0].Name != "same" {
		t.Fatalf("streams %+v", res.Streams)
	}
	var sb strings.Builder
	if err := WriteOverheadTable(&sb, res, "same"); err != nil || !strings.Contains(sb.String(), "1.00x") {
		t.Fatalf("table %q %v", sb.String(), err)
	}
}

// TestStreamCPUAdd: rounds fold into CPU per stream weighted by each
// round's streams.
func TestStreamCPUAdd(t *testing.T) {
	var s StreamCPU
	s.add(StreamCPU{Name: "a", Streams: 3, CPUMsPerStrm: 10, WallSeconds: 1, TokensPerStrm: 5})
	s.add(StreamCPU{Name: "a", Streams: 1, CPUMsPerStrm: 30, WallSeconds: 2, Errors: 1, TokensPerStrm: 5})
	want := StreamCPU{Name: "a", Streams: 4, CPUMsPerStrm: 15, WallSeconds: 3, Errors: 1, TokensPerStrm: 5}
	if s != want {
		t.Fatalf("got %+v, want %+v", s, want)
	}
}
