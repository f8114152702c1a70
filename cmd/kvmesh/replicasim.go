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
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

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
	level := hclog.LevelFromString(*logLevel)
	if level == hclog.NoLevel {
		return fmt.Errorf("replica-sim: invalid --log-level %q", *logLevel)
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "replica-sim", Level: level, Output: stderr, JSONFormat: *logJSON})

	reg := prometheus.NewRegistry()
	sim, err := replicasim.New(cfg, logger, reg)
	if err != nil {
		return fmt.Errorf("replica-sim: %w", err)
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
