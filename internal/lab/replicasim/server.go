package replicasim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/zeebo/xxh3"
)

// Server is one simulated replica. Its handler is safe for concurrent use.
type Server struct {
	cfg     Config
	logger  hclog.Logger
	cache   *prefixCache
	sched   *scheduler
	prefill lane
	m       *metrics
	handler http.Handler
	created int64 // unix seconds, for /v1/models
	maxBody int64
	seq     atomic.Uint64 // request counter, for response IDs
	stored  *responseStore
	// kv holds prompts prefilled for remote decodes; client pulls them
	// from prefill replicas; ledger remembers the requests (pd.go).
	kv      *kvStore
	client  *http.Client
	ledger  ledger
	sources atomic.Pointer[[]byte] // GET /kv_event_sources, when publishing (kvevents.go)
	freeze  freezer                // the stall switch (freeze.go)

	// ctx ends when Close is called; every sequence watches it.
	ctx      context.Context
	cancel   context.CancelFunc
	inflight sync.WaitGroup
	active   atomic.Int64 // generation handlers running (Active)
	closing  sync.Once
}

// New builds a replica from cfg (zero fields take defaults) and registers its
// metrics on reg. GET /metrics serves reg when it is also a
// prometheus.Gatherer (such as *prometheus.Registry); otherwise, or when reg
// is nil, it serves a private registry holding the replica's metrics.
func New(cfg Config, logger hclog.Logger, reg prometheus.Registerer) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s := &Server{
		cfg:     cfg,
		logger:  logger,
		cache:   newPrefixCache(cfg.KVBlocks, cfg.BlockSize),
		prefill: make(lane, 1),
		created: time.Now().Unix(),
		maxBody: defaultMaxBody,
		stored:  newResponseStore(maxStoredResponses),
		kv:      newKVStore(cfg.KVHold),
		client:  &http.Client{Timeout: cfg.KVHold + 10*time.Second},
		freeze:  freezer{after: cfg.StallAfter},
	}
	s.m = newMetrics(cfg, func() float64 { return float64(s.cache.len()) / float64(cfg.KVBlocks) })
	s.sched = &scheduler{max: cfg.MaxNumSeqs, onChange: func(r, w int) {
		s.m.running.Set(float64(r))
		s.m.waiting.Set(float64(w))
	}, loras: newLoRAState(cfg, s.scaled(cfg.LoRALoadMs/1000), s.m.loraLoads, s.m.loraInfo)}
	gatherer, ok := reg.(prometheus.Gatherer)
	if !ok || reg == nil {
		private := prometheus.NewRegistry()
		if err := s.m.register(private); err != nil {
			return nil, err
		}
		gatherer = private
	}
	if reg != nil {
		if err := s.m.register(reg); err != nil {
			return nil, err
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.tracked(func(w http.ResponseWriter, r *http.Request) {
		s.serveGenerate(w, r, chatEndpoint)
	}))
	mux.HandleFunc("POST /v1/completions", s.tracked(func(w http.ResponseWriter, r *http.Request) {
		s.serveGenerate(w, r, completionEndpoint)
	}))
	mux.HandleFunc("POST /v1/responses", s.tracked(func(w http.ResponseWriter, r *http.Request) {
		s.serveGenerate(w, r, responsesEndpoint)
	}))
	mux.HandleFunc("POST /v1/messages", s.tracked(func(w http.ResponseWriter, r *http.Request) {
		s.serveGenerate(w, r, messagesEndpoint)
	}))
	mux.HandleFunc("GET /v1/responses/{id}", s.serveStoredResponse)
	mux.HandleFunc("POST /v1/embeddings", s.serveEmbeddings)
	mux.HandleFunc("GET /v1/models", s.serveModels)
	mux.HandleFunc("POST /kvsim/pull", s.servePull)
	mux.HandleFunc("GET /kvsim/requests", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, s.Ledger()) })
	mux.HandleFunc("GET /kv_event_sources", s.serveKVEventSources)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) {
		s.cache.reset()
		s.logger.Info("prefix cache reset")
		w.WriteHeader(http.StatusOK)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /debug/stall", s.serveFreeze(true))
	mux.HandleFunc("POST /debug/resume", s.serveFreeze(false))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "Not Found")
	})
	s.handler = mux
	logger.Info("replica simulator ready", "model", cfg.Model, "block_size", cfg.BlockSize,
		"kv_blocks", cfg.KVBlocks, "max_num_seqs", cfg.MaxNumSeqs, "time_scale", cfg.TimeScale,
		"lora_adapters", len(cfg.LoRAAdapters), "max_loras", cfg.MaxLoRAs, "role", cfg.Role)
	return s, nil
}

// Handler returns the HTTP handler serving the vLLM-compatible endpoints.
func (s *Server) Handler() http.Handler { return s.handler }

// Close ends every in-flight sequence (streams stop without [DONE],
// non-streaming requests get 503), waits for their handlers to return and
// makes later generation requests fail with 503. The simulator starts no
// background goroutines of its own. A handler blocked writing to a stalled
// client returns when the HTTP server's write times out or its connection
// is closed.
func (s *Server) Close() error {
	s.closing.Do(func() {
		s.cancel()
		s.inflight.Wait()
		s.kv.close()
		s.client.CloseIdleConnections()
		s.logger.Debug("replica simulator closed")
	})
	return nil
}

// Active is how many generation requests the replica is serving: once
// it is 0, every request it served is in its Ledger.
func (s *Server) Active() int { return int(s.active.Load()) }

// tracked counts a generation handler as in flight for Close.
func (s *Server) tracked(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.inflight.Add(1)
		s.active.Add(1)
		defer s.inflight.Done()
		defer s.active.Add(-1)
		h(w, r)
	}
}

// serveModels lists the base model and, as vLLM does, each LoRA adapter
// with the base model as its parent.
func (s *Server) serveModels(w http.ResponseWriter, r *http.Request) {
	data := []map[string]any{{
		"id":            s.cfg.Model,
		"object":        "model",
		"created":       s.created,
		"owned_by":      "vllm",
		"root":          s.cfg.Model,
		"parent":        nil,
		"max_model_len": s.cfg.MaxModelLen,
		"permission":    []any{},
	}}
	for _, a := range s.cfg.LoRAAdapters {
		data = append(data, map[string]any{
			"id":            a,
			"object":        "model",
			"created":       s.created,
			"owned_by":      "vllm",
			"root":          a,
			"parent":        s.cfg.Model,
			"max_model_len": nil,
			"permission":    []any{},
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// scaled converts a modelled duration in seconds to wall time.
func (s *Server) scaled(seconds float64) time.Duration {
	return time.Duration(seconds / s.cfg.TimeScale * float64(time.Second))
}

// sequence is one admitted request as the engine runs it.
type sequence struct {
	id           string
	created      int64
	req          parsedRequest
	ep           endpoint
	promptTokens int
	maxTokens    int
	hashes       []uint64 // full prompt blocks
	seed         uint64   // picks the filler words
	adapter      string   // its LoRA adapter, "" for the base model
	plan         pdPlan   // its part of a disaggregated request (pd.go)
	reqID        string   // X-Request-Id
	host         string   // this replica's address as the request reached it
}

func (s *Server) serveGenerate(w http.ResponseWriter, r *http.Request, ep endpoint) {
	if s.ctx.Err() != nil {
		writeError(w, http.StatusServiceUnavailable, "The server is shutting down.")
		return
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, err := parseRequest(ep, body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	plan, err := req.PD.plan(s.cfg.Role, req.MaxTokens)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	adapter := ""
	switch {
	case req.Model == "" || req.Model == s.cfg.Model:
		req.Model = s.cfg.Model // responses name the served model
	case s.sched.loras.knows(req.Model):
		adapter = req.Model // responses name the adapter, as vLLM's do
	default:
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	if id := req.PreviousResponseID; id != "" {
		// The engine holds the earlier turns; the new input follows them.
		prev, ok := s.stored.get(id)
		if !ok {
			writeError(w, http.StatusNotFound, fmt.Sprintf("Response with id '%s' not found.", id))
			return
		}
		req.Prompt = prev.text + req.Prompt
	}
	seq := &sequence{
		created:      time.Now().Unix(),
		req:          req,
		ep:           ep,
		promptTokens: countTokens(req.Prompt),
		maxTokens:    req.MaxTokens,
		hashes:       blockHashes(req.Prompt, s.cfg.BlockSize, loraRoot(adapter)),
		seed:         xxh3.HashString(req.Prompt),
		adapter:      adapter,
		plan:         plan,
		reqID:        r.Header.Get("X-Request-Id"),
		host:         r.Host,
	}
	if seq.maxTokens == 0 {
		seq.maxTokens = s.cfg.DefaultMaxTokens
	}
	if total := seq.promptTokens + seq.maxTokens; total > s.cfg.MaxModelLen {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens "+
				"(%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			s.cfg.MaxModelLen, total, seq.promptTokens, seq.maxTokens))
		return
	}
	prefix := "chatcmpl-"
	switch ep {
	case completionEndpoint:
		prefix = "cmpl-"
	case responsesEndpoint:
		prefix = "resp_"
	case messagesEndpoint:
		prefix = "msg_"
	}
	seq.id = fmt.Sprintf("%s%016x%08x", prefix, seq.seed, s.seq.Add(1))
	s.freeze.admit()

	// The sequence ends when the client goes away or the server closes.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	s.run(ctx, w, seq)
}

// run moves a sequence through the engine: wait for a slot (and its
// LoRA adapter), pull the KV of a decode's prompt from its prefill
// replica (pd.go), prefill the uncached part of the prompt on the
// prefill lane, then either hand a prefill's KV over (prefillAnswer) or
// decode maxTokens tokens and cache prompt + answer. Every request
// leaves an entry in the ledger.
func (s *Server) run(ctx context.Context, w http.ResponseWriter, seq *sequence) {
	start := time.Now()
	led := LedgerEntry{RequestID: seq.reqID, Kind: seq.plan.mode.kind(), PromptTokens: seq.promptTokens,
		BlockTokens: len(seq.hashes) * s.cfg.BlockSize, Outcome: "cancelled"}
	defer func() { s.ledger.add(led) }()
	fail := func(err error) {
		// Nothing was written yet; a gone client never reads this.
		if s.ctx.Err() != nil {
			writeError(w, http.StatusServiceUnavailable, "The server is shutting down.")
			led.Outcome = "error"
			return
		}
		s.logger.Debug("sequence cancelled before output", "id", seq.id, "error", err)
	}
	ready, err := s.sched.acquire(ctx, seq.adapter)
	if err != nil {
		fail(err)
		return
	}
	defer s.sched.release(seq.adapter)
	// A LoRA adapter that was not resident is being loaded: its requests
	// wait for it (lora.go).
	if err := sleepUntil(ctx, ready); err != nil {
		fail(err)
		return
	}
	// vLLM always computes the last prompt token (it needs its logits), so
	// a block holding it can never be a hit.
	matchable := seq.hashes
	if maxHit := (seq.promptTokens - 1) / s.cfg.BlockSize; maxHit < len(matchable) {
		matchable = matchable[:max(maxHit, 0)]
	}
	held := s.cache.matchAndAcquire(matchable)
	local := len(held) * s.cfg.BlockSize
	cached := local
	if seq.plan.mode == modeDecodeVLLM || seq.plan.mode == modeDecodeSGLang {
		remote, err := s.pull(ctx, seq.plan)
		switch {
		case ctx.Err() != nil:
			s.cache.release(held)
			fail(ctx.Err())
			return
		case err != nil:
			// vLLM's kv_load_failure_policy "recompute"; SGLang's
			// decode fails the request.
			s.logger.Warn("KV pull failed", "id", seq.id, "error", err)
			if seq.plan.mode == modeDecodeSGLang {
				s.cache.release(held)
				writeError(w, http.StatusInternalServerError, fmt.Sprintf("KV transfer failed: %v", err))
				led.Outcome = "error"
				return
			}
			led.Outcome = "pull_failed"
		default:
			remote = min(remote, len(matchable)*s.cfg.BlockSize)
			transfer := max(remote-local, 0)
			if err := sleepUntil(ctx, time.Now().Add(s.scaled(float64(transfer)/s.cfg.TransferTokensPerS))); err != nil {
				s.cache.release(held)
				fail(err)
				return
			}
			led.PulledTokens, cached = transfer, max(local, remote)
		}
	}
	if err := s.prefill.lock(ctx); err != nil {
		s.cache.release(held)
		fail(err)
		return
	}
	s.m.prefixQueries.Add(float64(seq.promptTokens))
	s.m.prefixHits.Add(float64(local))
	uncached := seq.promptTokens - cached
	led.CachedTokens, led.ComputedTokens = local, uncached
	err = sleepUntil(ctx, time.Now().Add(s.scaled(float64(uncached)/s.cfg.PrefillTokensPerS)))
	if err == nil {
		err = s.freeze.wait(ctx) // a frozen engine completes no prefill
	}
	s.prefill.unlock()
	if err != nil {
		s.cache.release(held)
		fail(err)
		return
	}
	s.m.promptTokens.Add(float64(seq.promptTokens))
	// The prompt's blocks are computed now: cache them, pinned while running.
	promptHeld := s.cache.acquire(seq.hashes)
	s.cache.release(held)
	defer func() { s.cache.release(promptHeld) }()
	if seq.plan.mode == modePrefillVLLM || seq.plan.mode == modePrefillSGLang {
		s.prefillAnswer(ctx, w, seq, cached, start, &led)
		return
	}

	u := usage{PromptTokens: seq.promptTokens, CompletionTokens: seq.maxTokens,
		TotalTokens: seq.promptTokens + seq.maxTokens, PromptTokensDetails: &tokenDetails{CachedTokens: cached}}
	var answer strings.Builder
	answer.Grow(seq.maxTokens * bytesPerToken)
	out := newOutput(w, seq)
	out.u = u
	perToken := s.scaled(s.cfg.DecodeMsPerToken / 1000)
	// The first token comes out of prefill; each later one costs a decode
	// step. Deadlines are absolute so timer overhead does not accumulate.
	firstAt := time.Now()
	for i := range seq.maxTokens {
		if i > 0 {
			if err := sleepUntil(ctx, firstAt.Add(time.Duration(i)*perToken)); err != nil {
				s.abort(w, out, seq, err)
				led.Outcome = "cut"
				return
			}
		}
		if s.freeze.frozen() {
			// Frozen mid-answer: nothing more until it thaws, then the
			// answer goes on from here (its schedule moved by the pause).
			if err := s.freeze.wait(ctx); err != nil {
				s.abort(w, out, seq, err)
				return
			}
			firstAt = time.Now().Add(-time.Duration(i) * perToken)
		}
		if i == 0 {
			s.m.ttft.Observe(time.Since(start).Seconds())
		}
		tok := fillerToken(seq.seed, i)
		answer.WriteString(tok)
		s.m.generationTokens.Inc()
		if err := out.token(tok, i == seq.maxTokens-1); err != nil {
			s.logger.Debug("client write failed", "id", seq.id, "error", err)
			led.Outcome = "cut"
			return
		}
	}
	// The engine keeps the KV of prompt + answer; cache its blocks as the
	// next turn will render them.
	full := seq.req.Prompt + answer.String()
	if seq.ep != completionEndpoint {
		full += imEnd
	}
	s.cache.release(s.cache.acquire(blockHashes(full, s.cfg.BlockSize, loraRoot(seq.adapter))))
	if seq.ep == responsesEndpoint && seq.req.Store {
		// Stored before the client can see the response, so that a next
		// turn naming it always finds it.
		out.store = func(obj responseObject) { s.stored.add(seq.id, full, obj) }
	}
	out.finish(answer.String(), u)
	if led.Outcome == "cancelled" {
		led.Outcome = "ok"
	}
}

// prefillAnswer hands a prefilled prompt over to its decode and answers
// the prefill's one token: at once with kv_transfer_params naming this
// replica (vLLM), or once the decode of its room claimed the KV
// (SGLang; 500 when none does within the hold). The prompt's full
// blocks stay pinned until pulled or expired.
func (s *Server) prefillAnswer(ctx context.Context, w http.ResponseWriter, seq *sequence, cached int, start time.Time, led *LedgerEntry) {
	key := seq.plan.key
	if seq.plan.mode == modePrefillVLLM {
		key = "vllm:" + seq.id
	}
	pin := s.cache.acquire(seq.hashes)
	e := s.kv.register(key, len(pin)*s.cfg.BlockSize, func() { s.cache.release(pin) })
	if e == nil {
		s.cache.release(pin)
		writeError(w, http.StatusServiceUnavailable, "no room to hold the KV for a remote decode")
		led.Outcome = "error"
		return
	}
	out := newOutput(w, seq)
	if seq.plan.mode == modePrefillVLLM {
		kv := vllmParams(seq.host, seq.id, len(pin))
		out.kv = &kv
	} else {
		t := time.NewTimer(s.cfg.KVHold)
		defer t.Stop()
		select {
		case <-e.claimed:
		case <-ctx.Done():
			s.kv.expire(key, e) // a prefill that gives up lets its KV go, as SGLang's does
			s.logger.Debug("prefill cancelled while holding its KV", "id", seq.id)
			return
		case <-t.C:
			s.kv.expire(key, e)
			writeError(w, http.StatusInternalServerError, fmt.Sprintf("KV transfer timed out: no decode claimed %s within %v", key, s.cfg.KVHold))
			led.Outcome = "error"
			return
		}
	}
	s.m.ttft.Observe(time.Since(start).Seconds())
	s.m.generationTokens.Inc()
	tok := fillerToken(seq.seed, 0)
	seq.maxTokens = 1
	u := usage{PromptTokens: seq.promptTokens, CompletionTokens: 1, TotalTokens: seq.promptTokens + 1,
		PromptTokensDetails: &tokenDetails{CachedTokens: cached}}
	out.u = u
	if err := out.token(tok, true); err != nil {
		return
	}
	out.finish(tok, u)
	led.Outcome = "ok"
}

// abort ends a sequence cut short after it started producing output.
func (s *Server) abort(w http.ResponseWriter, out *output, seq *sequence, err error) {
	s.logger.Debug("sequence cancelled", "id", seq.id, "error", err)
	if !seq.req.Stream && s.ctx.Err() != nil {
		writeError(w, http.StatusServiceUnavailable, "The server is shutting down.")
	}
}

// readBody reads a request body under the size limit, answering the
// client itself when it cannot.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("Request body exceeds the limit of %d bytes.", mbe.Limit))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, fmt.Sprintf("reading request body: %v", err))
		return nil, false
	}
	return body, true
}

// maxStoredResponses bounds the Responses conversations kept for
// previous_response_id (vLLM keeps them in memory too).
const maxStoredResponses = 4096

// responseStore keeps recent stored responses by id, dropping the oldest
// beyond its bound: the conversation text (prompt + answer) a later turn
// continues, and the response object GET /v1/responses/{id} returns.
type responseStore struct {
	mu      sync.Mutex
	max     int
	entries map[string]storedResponse
	order   []string // ids, oldest first
}

type storedResponse struct {
	text string
	obj  responseObject
}

func newResponseStore(max int) *responseStore {
	return &responseStore{max: max, entries: make(map[string]storedResponse)}
}

func (rs *responseStore) add(id, text string, obj responseObject) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, ok := rs.entries[id]; !ok {
		rs.order = append(rs.order, id)
	}
	rs.entries[id] = storedResponse{text: text, obj: obj}
	for len(rs.order) > rs.max {
		delete(rs.entries, rs.order[0])
		rs.order = rs.order[1:]
	}
}

func (rs *responseStore) get(id string) (storedResponse, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	e, ok := rs.entries[id]
	return e, ok
}

// serveStoredResponse serves GET /v1/responses/{id}.
func (s *Server) serveStoredResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	e, ok := s.stored.get(id)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("Response with id '%s' not found.", id))
		return
	}
	writeJSON(w, http.StatusOK, e.obj)
}
