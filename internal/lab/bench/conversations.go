package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// ConvConfig is the multi-turn chat workload: Conversations conversations
// of Turns turns each, run by Clients concurrent clients. Every
// conversation opens with one shared system prompt and a document of its
// own, then asks short questions; each answer is sent back as history in
// the next turn, after a think time. A client runs one conversation to its
// end, then takes the next.
type ConvConfig struct {
	Frontends     []string      // base URLs; turn t of conversation c goes to Frontends[(c+t) % len], so consecutive turns meet different routers
	Model         string        // the "model" field
	Conversations int           // default 24
	Turns         int           // turns per conversation, default 6
	Clients       int           // concurrent clients, default 12
	Think         time.Duration // pause between an answer and the next question; default 400 ms, negative for none
	SystemWords   int           // shared system prompt, default 250 words
	DocumentWords int           // per-conversation document, default 600 words
	TurnWords     int           // each user question, default 30 words
	AnswerTokens  int           // max_tokens of each turn (the median when AnswerSigma > 0), default 100
	// AnswerSigma, when > 0, draws each turn's max_tokens lognormal with
	// median AnswerTokens and this σ (answerTokens); 0 asks AnswerTokens
	// of every turn.
	AnswerSigma float64
	// IgnoreEOS sends "ignore_eos": true (llama.cpp's server and vLLM
	// honour it), so each answer runs to its max_tokens instead of the
	// model's choice of where to stop.
	IgnoreEOS  bool
	Seed       uint64       // text generation seed
	HTTPClient *http.Client // nil: DefaultHTTPClient(Clients)
	Progress   io.Writer    // nil: none; else one line per finished conversation
	// RequestIDs, when set, names each turn to the engines: its
	// X-Request-Id is RequestID(RequestIDs, conversation, turn), so that
	// what the replicas log of it can be joined to its turn.
	RequestIDs string
}

// RequestID is the X-Request-Id of turn t (from 0) of conversation c in a
// run whose ConvConfig.RequestIDs is prefix.
func RequestID(prefix string, c, t int) string { return fmt.Sprintf("%s-c%d-t%d", prefix, c, t) }

func (c *ConvConfig) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Conversations, 24)
	def(&c.Turns, 6)
	def(&c.Clients, 12)
	def(&c.SystemWords, 250)
	def(&c.DocumentWords, 600)
	def(&c.TurnWords, 30)
	def(&c.AnswerTokens, 100)
	if c.Think == 0 {
		c.Think = 400 * time.Millisecond
	}
	c.Think = max(c.Think, 0)
}

// ConvResult is what one conversation run measured. Cache shares are
// the engines' own reports: Σ usage.prompt_tokens_details.cached_tokens /
// Σ usage.prompt_tokens.
type ConvResult struct {
	Name                  string         `json:"name"`
	Commit                string         `json:"commit,omitempty"`
	Turns                 int            `json:"turns"` // completed
	Errors                int            `json:"errors"`
	ErrorsByKind          map[string]int `json:"errors_by_kind"`
	FollowupCachedShare   float64        `json:"followup_cached_share"`   // turns 2..T
	FirstTurnCachedShare  float64        `json:"first_turn_cached_share"` // turn 1 (the system prompt, at best)
	FollowupPromptTokens  int64          `json:"followup_prompt_tokens"`
	FollowupCachedTokens  int64          `json:"followup_cached_tokens"`
	TTFTP50Ms             float64        `json:"ttft_p50_ms"` // all turns
	TTFTP90Ms             float64        `json:"ttft_p90_ms"`
	TTFTP99Ms             float64        `json:"ttft_p99_ms"`
	MeanTTFTMs            float64        `json:"mean_ttft_ms"`
	FollowupTTFTP50Ms     float64        `json:"followup_ttft_p50_ms"`
	FollowupTTFTP90Ms     float64        `json:"followup_ttft_p90_ms"`
	FollowupTTFTP99Ms     float64        `json:"followup_ttft_p99_ms"`
	NoUsage               int            `json:"no_usage"` // completed turns without usage
	WallSeconds           float64        `json:"wall_seconds"`
	ConversationsFinished int            `json:"conversations_finished"`
	// Requests is every turn sent, in the order sent: what a tail is made
	// of (which turn, when, beside what) and, joined by its request id or
	// its send time and prompt length, what the engine measured of it.
	Requests []TurnRecord `json:"requests,omitempty"`
	// StartedUnixMs is the wall time the run started (Requests' time 0),
	// to line them up with what the engines timestamped.
	StartedUnixMs int64 `json:"started_unix_ms,omitempty"`
}

// TurnRecord is one turn as the client saw it.
type TurnRecord struct {
	Conversation int     `json:"conversation"`
	Turn         int     `json:"turn"` // from 0
	ID           string  `json:"id,omitempty"`
	SentMs       float64 `json:"sent_ms"` // since the run started
	TTFTMs       float64 `json:"ttft_ms"`
	// FirstChunkMs is the time to the first chunk of any choice, text or
	// not: a first token of no text (vLLM streams its role chunk with it)
	// shows here, while TTFT waits for the first text.
	FirstChunkMs float64 `json:"first_chunk_ms"`
	EndMs        float64 `json:"end_ms"` // the stream's end, since the run started
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	// MaxTokens is the max_tokens the turn asked for; CompletionTokens
	// what the engine reports it answered (less when it stopped at EOS).
	MaxTokens        int    `json:"max_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	Error            string `json:"error,omitempty"`
}

// wordList is the vocabulary of generated text: common English words, so
// a byte-per-token estimate of 4–5 holds as for real prose.
var wordList = strings.Fields(`the of and to in is that for it as was with be by on not he this are or his
from at which but have an they you were her she there one all we their been has would when who will more
no if out so said what up its about into than them can only other new some could time these two may then do
first any my now such like our over man me even most made after also did many before must through back years
where much your way well down should because each just those people how too little state good very make world
still own see men work long get here between both life being under never day same another know while last might
us great old year off come since against go came right used take three small system answer question document
model cache server request token router replica memory network latency policy cluster prompt engine queue`)

// words appends n words drawn from r to b.
func words(b *strings.Builder, r *rand.Rand, n int) {
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(wordList[r.IntN(len(wordList))])
	}
}

// convText builds the fixed texts of a run: the system prompt, each
// conversation's document and each turn's question.
type convText struct {
	system    string
	documents []string
	questions [][]string
}

func newConvText(c ConvConfig) convText {
	var t convText
	var b strings.Builder
	r := rand.New(rand.NewPCG(c.Seed, 0))
	b.WriteString("You are a careful assistant. ")
	words(&b, r, c.SystemWords)
	t.system = b.String()
	for i := range c.Conversations {
		r := rand.New(rand.NewPCG(c.Seed, uint64(i)+1))
		b.Reset()
		fmt.Fprintf(&b, "Document %d. ", i)
		words(&b, r, c.DocumentWords)
		t.documents = append(t.documents, b.String())
		qs := make([]string, c.Turns)
		for j := range qs {
			b.Reset()
			words(&b, r, c.TurnWords)
			b.WriteByte('?')
			qs[j] = b.String()
		}
		t.questions = append(t.questions, qs)
	}
	return t
}

// turnOutcome is one turn's measurement.
type turnOutcome struct {
	conv, turn int
	id         string
	maxTokens  int
	sent, end  time.Time
	o          outcome
}

// RunConversations runs the multi-turn chat workload against one front
// end (or one set of routers) and measures follow-up cache share and
// TTFT. Errors end their conversation (its history would be wrong) and
// are counted; cancellation stops the run and returns what was measured
// with ctx's error.
func RunConversations(ctx context.Context, name string, cfg ConvConfig) (ConvResult, error) {
	cfg.defaults()
	res := ConvResult{Name: name, ErrorsByKind: map[string]int{}}
	if len(cfg.Frontends) == 0 {
		return res, errors.New("bench: no front ends")
	}
	client := cfg.HTTPClient
	if client == nil {
		client = DefaultHTTPClient(cfg.Clients)
	}
	urls := make([]string, len(cfg.Frontends))
	for i, f := range cfg.Frontends {
		urls[i] = strings.TrimRight(f, "/") + "/v1/chat/completions"
	}
	text := newConvText(cfg)

	var (
		mu       sync.Mutex
		outcomes []turnOutcome
		finished int
	)
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.Clients {
		wg.Go(func() {
			for c := range next {
				got, ok := runConversation(ctx, client, urls, cfg, text, c)
				mu.Lock()
				outcomes = append(outcomes, got...)
				if ok {
					finished++
				}
				if cfg.Progress != nil {
					fmt.Fprintf(cfg.Progress, "\r%s: %d/%d conversations", name, finished, cfg.Conversations)
				}
				mu.Unlock()
			}
		})
	}
feed:
	for c := range cfg.Conversations {
		select {
		case next <- c:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if cfg.Progress != nil {
		fmt.Fprintln(cfg.Progress)
	}
	res.WallSeconds = time.Since(start).Seconds()
	res.StartedUnixMs = start.UnixMilli()
	res.ConversationsFinished = finished

	var all, follow []float64
	var firstPrompt, firstCached int64
	slices.SortStableFunc(outcomes, func(a, b turnOutcome) int { return a.sent.Compare(b.sent) })
	since := func(t time.Time) float64 { return float64(t.Sub(start)) / float64(time.Millisecond) }
	for _, t := range outcomes {
		res.Requests = append(res.Requests, TurnRecord{
			Conversation: t.conv, Turn: t.turn, ID: t.id, SentMs: since(t.sent),
			TTFTMs: float64(t.o.ttft) / float64(time.Millisecond), EndMs: since(t.end),
			FirstChunkMs: float64(t.o.firstChunk) / float64(time.Millisecond),
			PromptTokens: t.o.prompt, CachedTokens: t.o.cached, MaxTokens: t.maxTokens,
			CompletionTokens: t.o.completion, Error: t.o.kind,
		})
		if t.o.kind != "" {
			res.Errors++
			res.ErrorsByKind[t.o.kind]++
			continue
		}
		res.Turns++
		ms := float64(t.o.ttft) / float64(time.Millisecond)
		all = append(all, ms)
		if t.turn > 0 {
			follow = append(follow, ms)
		}
		if !t.o.hasUsage {
			res.NoUsage++
			continue
		}
		if t.turn > 0 {
			res.FollowupPromptTokens += t.o.prompt
			res.FollowupCachedTokens += t.o.cached
		} else {
			firstPrompt += t.o.prompt
			firstCached += t.o.cached
		}
	}
	if res.FollowupPromptTokens > 0 {
		res.FollowupCachedShare = float64(res.FollowupCachedTokens) / float64(res.FollowupPromptTokens)
	}
	if firstPrompt > 0 {
		res.FirstTurnCachedShare = float64(firstCached) / float64(firstPrompt)
	}
	slices.Sort(all)
	slices.Sort(follow)
	res.TTFTP50Ms, res.TTFTP90Ms, res.TTFTP99Ms = percentile(all, 0.5), percentile(all, 0.9), percentile(all, 0.99)
	res.FollowupTTFTP50Ms, res.FollowupTTFTP90Ms, res.FollowupTTFTP99Ms = percentile(follow, 0.5), percentile(follow, 0.9), percentile(follow, 0.99)
	if len(all) > 0 {
		var sum float64
		for _, v := range all {
			sum += v
		}
		res.MeanTTFTMs = sum / float64(len(all))
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("bench %s: %w", name, err)
	}
	return res, nil
}

// runConversation runs conversation c turn by turn. ok reports that every
// turn completed.
func runConversation(ctx context.Context, client *http.Client, urls []string, cfg ConvConfig, text convText, c int) (outs []turnOutcome, ok bool) {
	msgs := []chatMessage{{Role: "system", Content: text.system}}
	for t := range cfg.Turns {
		if t > 0 && cfg.Think > 0 {
			timer := time.NewTimer(cfg.Think)
			select {
			case <-ctx.Done():
				timer.Stop()
				return outs, false
			case <-timer.C:
			}
		}
		q := text.questions[c][t]
		if t == 0 {
			q = text.documents[c] + "\n\n" + q
		}
		msgs = append(msgs, chatMessage{Role: "user", Content: q})
		id := ""
		if cfg.RequestIDs != "" {
			id = RequestID(cfg.RequestIDs, c, t)
		}
		maxTokens := answerTokens(cfg, c, t)
		sent := time.Now()
		o, answer := chatTurn(ctx, client, urls[(c+t)%len(urls)], cfg.Model, msgs, maxTokens, cfg.IgnoreEOS, id)
		outs = append(outs, turnOutcome{conv: c, turn: t, id: id, maxTokens: maxTokens, sent: sent, end: time.Now(), o: o})
		if o.kind != "" {
			return outs, false
		}
		msgs = append(msgs, chatMessage{Role: "assistant", Content: answer})
	}
	return outs, true
}

// chatTurn sends one streaming chat request (named id, when not "";
// with "ignore_eos": true when ignoreEOS) and
// returns its outcome and the answer text.
func chatTurn(ctx context.Context, client *http.Client, url, model string, msgs []chatMessage, maxTokens int, ignoreEOS bool, id string) (outcome, string) {
	body := chatRequest{Model: model, Messages: msgs, MaxTokens: maxTokens, Stream: true, IgnoreEOS: ignoreEOS}
	body.StreamOptions.IncludeUsage = true
	buf, err := json.Marshal(body)
	if err != nil {
		return outcome{kind: "encode"}, ""
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(buf))
	if err != nil {
		return outcome{kind: "bad_url"}, ""
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	sent := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return outcome{kind: errKind(ctx, err, "connect")}, ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		return outcome{kind: fmt.Sprintf("http_%d", resp.StatusCode)}, ""
	}
	var answer strings.Builder
	o := readStreamInto(ctx, resp.Body, sent, &answer)
	return o, answer.String()
}

// WriteConvTable prints one row per front end.
func WriteConvTable(w io.Writer, rs []ConvResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-22s %6s %6s %10s %10s %9s %9s %11s %11s %7s\n",
		"front end", "turns", "errors", "follow-up", "turn-1", "TTFT p50", "TTFT p99", "f-up p50", "f-up p99", "wall")
	fmt.Fprintf(&b, "%-22s %6s %6s %10s %10s %9s %9s %11s %11s %7s\n",
		"", "", "", "cached", "cached", "ms", "ms", "ms", "ms", "s")
	for _, r := range rs {
		fmt.Fprintf(&b, "%-22s %6d %6d %10.3f %10.3f %9.0f %9.0f %11.0f %11.0f %7.1f\n",
			r.Name, r.Turns, r.Errors, r.FollowupCachedShare, r.FirstTurnCachedShare,
			r.TTFTP50Ms, r.TTFTP99Ms, r.FollowupTTFTP50Ms, r.FollowupTTFTP99Ms, r.WallSeconds)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
