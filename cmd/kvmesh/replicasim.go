package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/kvevents"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
)

// replicaSimShutdownTimeout bounds how long in-flight responses may take to
// end once the command is cancelled.
const replicaSimShutdownTimeout = 10 * time.Second

// runReplicaSim serves one simulated vLLM-like replica until ctx is
// cancelled, then shuts it down gracefully.
func runReplicaSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replica-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg      replicasim.Config
		listen   = fs.String("listen", "127.0.0.1:8000", "`address` to serve the OpenAI API, /health, /reset_prefix_cache and /metrics on")
		logLevel = fs.String("log-level", "info", "log `level`: trace, debug, info, warn, error or off")
		logJSON  = fs.Bool("log-json", false, "write logs as JSON lines")
		kvEP     = fs.String("kv-events", "", "publish KV-cache events as vLLM does (ZMQ PUB of [topic, seq, msgpack batch]) on `tcp://HOST:PORT` (bound here; a router connects)")
		kvReplay = fs.String("kv-events-replay", "", "answer replay requests (vLLM's replay_endpoint, a ZMQ ROUTER) on `tcp://HOST:PORT`")
		kvTopic  = fs.String("kv-events-topic", "kv-events", "`topic` of the published events")
		kvForm   = fs.String("kv-events-form", "map", "event encoding: map (vLLM 0.32) or array (older releases)")
	)
	fs.StringVar(&cfg.Model, "model", "kvmesh-sim", "served model `name`; requests for another model get 404")
	fs.IntVar(&cfg.BlockSize, "block-size", 16, "`tokens` per KV block (vLLM's default is 16)")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", 8192, "KV cache capacity in `blocks`; least recently used unpinned blocks are evicted")
	fs.Float64Var(&cfg.PrefillTokensPerS, "prefill-tokens-per-s", 20000, "prefill throughput of the uncached prompt, in `tokens/s`, on one lane shared by all requests")
	fs.Float64Var(&cfg.DecodeMsPerToken, "decode-ms-per-token", 10, "decode time per output token per sequence, in `ms`")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", 64, "running sequences cap (`n`); more requests wait in FIFO order")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", 131072, "prompt + max_tokens limit in `tokens`; longer requests get 400")
	fs.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", 128, "output `tokens` when a request sets no max_tokens")
	fs.IntVar(&cfg.StallAfter, "stall-after", 0, "freeze the engine once this many generation `requests` were admitted, as POST /debug/stall does: /health, /v1/models and /metrics still answer, but no prefill completes, no token is generated and no counter moves until POST /debug/resume (0: never by itself; for tests of a router's stall detection)")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "speed-up `factor`: every modelled duration is divided by it (>1 runs faster than real time)")
	role := fs.String("role", "both", "`role` in disaggregated serving: both (whole requests; either vLLM leg), prefill or decode (only that leg, vLLM's kv_transfer_params or SGLang's bootstrap fields)")
	fs.Float64Var(&cfg.TransferTokensPerS, "kv-transfer-tokens-per-s", 200000, "how fast a decode pulls a prompt's KV from its prefill replica, in `tokens/s`")
	fs.DurationVar(&cfg.KVHold, "kv-hold", 30*time.Second, "how long a prefill keeps a prompt's KV for its decode, and a decode waits for its prefill (wall `time`, not scaled)")
	var adapters listFlag
	fs.Var(&adapters, "lora-adapters", "LoRA adapter `names` served on top of --model (vLLM's --lora-modules), comma-separated or repeated: listed in /v1/models with the model as parent, named by a request as its model")
	fs.IntVar(&cfg.MaxLoRAs, "max-loras", 1, "LoRA adapters resident at once (`n`, vLLM's --max-loras): one not resident is loaded, evicting the least recently used idle one")
	fs.Float64Var(&cfg.LoRALoadMs, "lora-load-ms", 50, "time to load a LoRA adapter that is not resident, in `ms`")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: kvmesh replica-sim [flags]

Serve a simulated vLLM-like OpenAI engine for machines without a GPU: a real
LRU prefix cache of KV blocks (one token per 4 bytes of text), a FIFO waiting
queue, one serialized prefill lane and per-token decode time, so TTFT and
usage.prompt_tokens_details.cached_tokens respond to routing. Endpoints:
POST /v1/chat/completions, POST /v1/completions, POST /v1/responses (and
GET /v1/responses/{id}), POST /v1/messages (Anthropic), POST /v1/embeddings,
GET /v1/models, GET /health, POST /reset_prefix_cache, GET /metrics (vLLM
metric names), and POST /debug/stall and /debug/resume, which freeze the
engine (no progress, while it still answers its health checks) and thaw it.
With --lora-adapters it serves LoRA adapters as vLLM does with --enable-lora: at most --max-loras resident, loaded on demand, listed in
/v1/models with their parent and in vllm:lora_requests_info. With --role
prefill or decode it serves one leg of disaggregated requests, by vLLM's
protocol (kv_transfer_params) or SGLang's (bootstrap_host, bootstrap_port,
bootstrap_room; its bootstrap port is its own HTTP port), and moves KV
between replicas through POST /kvsim/pull; GET /kvsim/requests lists its
recent requests (X-Request-Id, leg, prompt, cached, pulled and computed
tokens).

Every flag can also be set by the environment variable KVMESH_<FLAG>
(upper case, dashes to underscores, e.g. KVMESH_KV_BLOCKS); the command line wins.

flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("replica-sim: unexpected arguments %q", fs.Args())
	}
	if err := applyEnv(fs, os.LookupEnv); err != nil {
		return err
	}
	cfg.LoRAAdapters = adapters
	level := hclog.LevelFromString(*logLevel)
	if level == hclog.NoLevel {
		return fmt.Errorf("replica-sim: invalid --log-level %q", *logLevel)
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "replica-sim", Level: level, Output: stderr, JSONFormat: *logJSON})
	r, err := replicasim.ParseRole(*role)
	if err != nil {
		return fmt.Errorf("replica-sim: --role: %w", err)
	}
	cfg.Role = r

	reg := prometheus.NewRegistry()
	sim, err := replicasim.New(cfg, logger, reg)
	if err != nil {
		return fmt.Errorf("replica-sim: %w", err)
	}
	pub, err := startKVPublisher(sim, *kvEP, *kvReplay, *kvTopic, *kvForm)
	if err != nil {
		_ = sim.Close()
		return fmt.Errorf("replica-sim: %w", err)
	}
	if pub != nil {
		defer pub.Close()
		logger.Info("publishing KV events", "endpoint", *kvEP, "replay", *kvReplay)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		_ = sim.Close()
		return fmt.Errorf("replica-sim: listen %s: %w", *listen, err)
	}
	srv := &http.Server{
		Handler:           sim.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          logger.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String())
	fmt.Fprintf(stdout, "replica-sim listening on http://%s\n", ln.Addr())

	select {
	case err := <-serveErr:
		_ = sim.Close()
		return fmt.Errorf("replica-sim: serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	// Close ends the running sequences so Shutdown does not wait for long
	// generations; both run at once because Close waits for the handlers.
	simClosed := make(chan struct{})
	go func() {
		_ = sim.Close()
		close(simClosed)
	}()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), replicaSimShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Warn("graceful shutdown timed out; closing connections", "error", err)
		_ = srv.Close()
	}
	<-simClosed
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("replica-sim: serve: %w", err)
	}
	return nil
}

// startKVPublisher publishes sim's KV events on endpoint (and answers
// replays on replay), or does nothing without an endpoint.
func startKVPublisher(sim *replicasim.Server, endpoint, replay, topic, form string) (*kvevents.Publisher, error) {
	if endpoint == "" {
		return nil, nil
	}
	f := kvevents.FormMap
	switch form {
	case "map":
	case "array":
		f = kvevents.FormArray
	default:
		return nil, fmt.Errorf("--kv-events-form %q: want map or array", form)
	}
	listen := func(ep string) (net.Listener, error) {
		addr, ok := strings.CutPrefix(ep, "tcp://")
		if !ok {
			return nil, fmt.Errorf("KV-event endpoint %q: want tcp://HOST:PORT", ep)
		}
		return net.Listen("tcp", addr)
	}
	ln, err := listen(endpoint)
	if err != nil {
		return nil, err
	}
	var rl net.Listener
	if replay != "" {
		if rl, err = listen(replay); err != nil {
			ln.Close()
			return nil, err
		}
	}
	pub := kvevents.NewPublisher(ln, rl, topic, f, 1000)
	// What the router's auto mode reads: the bound addresses, as vLLM
	// names its own (":0" resolved).
	ep := "tcp://" + ln.Addr().String()
	rep := ""
	if rl != nil {
		rep = "tcp://" + rl.Addr().String()
	}
	sim.PublishKVEvents(pub, ep, rep, topic)
	return pub, nil
}
