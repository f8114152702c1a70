package proxy

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTokenRatiosLearn: a replica's ratio is the default until it has
// seen enough prompt tokens, then its prompts' bytes over their tokens
// (weighted by tokens), bounded; another replica's is its own.
func TestTokenRatiosLearn(t *testing.T) {
	r := NewTokenRatios()
	r.Observe("a", 500, 200)
	if got := r.Of("a"); got != DefaultBytesPerToken {
		t.Fatalf("after 200 tokens: %v, want the default %v", got, DefaultBytesPerToken)
	}
	for range 20 {
		r.Observe("a", 500, 200)
	}
	if got := r.Of("a"); math.Abs(got-2.5) > 1e-9 {
		t.Fatalf("learned %v, want 2.5", got)
	}
	// A short prompt's template tokens weigh by its few tokens.
	r.Observe("a", 20, 10)
	if got := r.Of("a"); got < 2.45 || got > 2.5 {
		t.Errorf("after a short prompt: %v, want about 2.5", got)
	}
	if got := r.Of("b"); got != DefaultBytesPerToken {
		t.Errorf("an unseen replica: %v, want the default", got)
	}
	for range 10 {
		r.Observe("c", 100, 1000) // 0.1 byte per token: no text is that dense
		r.Observe("d", 1e6, 1000)
	}
	if c, d := r.Of("c"), r.Of("d"); c != minBytesPerToken || d != maxBytesPerToken {
		t.Errorf("bounded ratios %v and %v, want %v and %v", c, d, minBytesPerToken, maxBytesPerToken)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r)
	r.Observe("e", 50, 10) // not learned yet: the default
	want := `# HELP kvmesh_replica_bytes_per_token Bytes of the router's canonical prompt text per engine prompt token in use for each replica this router checks or had answers from: learned from its usage.prompt_tokens, 4 until it has reported 1000 prompt tokens.
# TYPE kvmesh_replica_bytes_per_token gauge
kvmesh_replica_bytes_per_token{replica="b"} 4
kvmesh_replica_bytes_per_token{replica="c"} 1
kvmesh_replica_bytes_per_token{replica="d"} 8
kvmesh_replica_bytes_per_token{replica="e"} 4
`
	// The replicas observed or asked about, as Of gives them.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want+fmt.Sprintf("kvmesh_replica_bytes_per_token{replica=%q} %v\n", "a", r.Of("a"))), "kvmesh_replica_bytes_per_token"); err != nil {
		t.Error(err)
	}
}

// TestPredictedCachedAtThePromptsRatio: the predicted cached tokens are
// the predicted blocks at the prompt's own bytes per token (the engine's
// prompt_tokens against the rendered text), not at a fixed 4; the
// replica's learned ratio shows on the router's metrics.
func TestPredictedCachedAtThePromptsRatio(t *testing.T) {
	body := chatBody("m", false, longPrompt)
	pr, err := prompt.RenderChat([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	tokens := len(pr.Text) / 2 // an engine counting 2 bytes per token
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, tokens, tokens)
	})
	const match = 6
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL, match: match})
	p, srv, reg := newTestProxy(t, view, nil)
	n := learnTokens/tokens + 1
	for range n {
		readAll(t, post(t, t.Context(), srv.URL+"/v1/chat/completions", body))
		view.waitDone(t)
	}
	bpt := float64(len(pr.Text)) / float64(tokens)
	// Each prediction counts the tail share learnt before it: the prior,
	// then every report of the whole prompt cached held the next block
	// whole.
	want, held, room := 0.0, tailPrior, 1.0
	for range n {
		want += (match + held/room) * float64(testContract.BlockBytes) / bpt
		held, room = held*(1-ratioDecay)+1, room*(1-ratioDecay)+1
	}
	if got := testutil.ToFloat64(p.m.predictedCached); math.Abs(got-want) > 1e-6 {
		t.Errorf("predicted cached tokens %v, want %v (%d blocks of %d bytes and the tail at %.3f bytes per token, %d times)", got, want, match, testContract.BlockBytes, bpt, n)
	}
	if got := p.ratios.Of(rep.URL); math.Abs(got-bpt) > 1e-9 {
		t.Errorf("learned %v bytes per token, want %v", got, bpt)
	}
	exp := fmt.Sprintf("# HELP kvmesh_replica_bytes_per_token Bytes of the router's canonical prompt text per engine prompt token in use for each replica this router checks or had answers from: learned from its usage.prompt_tokens, 4 until it has reported 1000 prompt tokens.\n# TYPE kvmesh_replica_bytes_per_token gauge\nkvmesh_replica_bytes_per_token{replica=%q} %v\n", rep.URL, bpt)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "kvmesh_replica_bytes_per_token"); err != nil {
		t.Error(err)
	}
}

// TestCachedTailLearn: the predicted cached tokens are the matched blocks
// and the learnt share of the block after them (half until reported);
// the share follows the engine's reports of prompts it held the match of,
// not its misses; a prompt that matched nothing predicts nothing, and one
// whose every whole block matched counts the share of its partial last
// block.
func TestCachedTailLearn(t *testing.T) {
	const bb = 1000
	r := NewTokenRatios()
	if got := r.Predict("a", 3, 10*bb, bb, 5); got != (3*bb+bb/2)/5 {
		t.Fatalf("before any report: %v, want 3.5 blocks at 5 bytes per token", got)
	}
	if got := r.Predict("a", 0, 10*bb, bb, 5); got != 0 {
		t.Fatalf("no match: %v, want 0", got)
	}
	// The prompt ends 400 bytes into its fourth block; all three match.
	if got := r.Predict("a", 3, 3*bb+400, bb, 5); got != (3*bb+200)/5 {
		t.Fatalf("whole blocks all matched: %v, want half the 400 bytes after them", got)
	}
	// An engine holding 3/4 of the block after the match, every time
	// (the prior fades to within a tenth of a token).
	for range 200 {
		r.ObserveCached("a", 3, 10*bb, bb, 5, (3*bb+3*bb/4)/5)
	}
	if got, want := r.Predict("a", 3, 10*bb, bb, 5), (3*bb+3.0*bb/4)/5; math.Abs(got-want) > 0.1 {
		t.Fatalf("learnt: %v, want %v", got, want)
	}
	// Misses (the engine held 1 block of the 3 matched) and cold prompts
	// tell nothing of the tail.
	for range 50 {
		r.ObserveCached("a", 3, 10*bb, bb, 5, bb/5)
		r.ObserveCached("a", 0, 10*bb, bb, 5, 0)
	}
	if got, want := r.Predict("a", 3, 10*bb, bb, 5), (3*bb+3.0*bb/4)/5; math.Abs(got-want) > 0.1 {
		t.Fatalf("after misses: %v, want %v", got, want)
	}
	// An engine counting in blocks of its own ends a little short of the
	// match: the share goes to 0, not below.
	for range 200 {
		r.ObserveCached("b", 3, 10*bb, bb, 5, (3*bb-100)/5)
	}
	if got, want := r.Predict("b", 3, 10*bb, bb, 5), 3.0*bb/5; math.Abs(got-want) > 0.1 {
		t.Fatalf("short of the match: %v, want %v", got, want)
	}
	if got := r.Predict("c", 3, 10*bb, bb, 5); got != (3*bb+bb/2)/5 {
		t.Fatalf("another replica: %v, want the prior", got)
	}
}
