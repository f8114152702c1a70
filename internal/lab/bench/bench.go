// Package bench replays an LLM-serving trace against real OpenAI-compatible
// endpoints (routers, load balancers or engines) in open loop and measures
// what a user sees: time to first token, goodput and the prefix-cache hit
// ratio the engines report in usage.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/trace"
)

// Config says what to replay, against which front ends and how hard.
type Config struct {
	Frontends     []string        // base URLs (http://127.0.0.1:port), used in turn: request i goes to Frontends[i % len] as DNS round-robin would
	Requests      []trace.Request // the trace, sorted by arrival
	Model         string          // the "model" field of every request
	Speedup       float64         // arrival times divided by this (open loop); <= 0 means 1
	Concurrency   int             // max in-flight requests; arrivals beyond it wait (and the wait is counted); <= 0 means 64
	Duration      time.Duration   // stop issuing new requests after this much wall time (0 = whole trace)
	MaxRequests   int             // 0 = all
	BytesPerToken int             // text synthesis, <= 0 means trace.DefaultBytesPerToken
	Progress      io.Writer       // nil = none; else a one-line progress bar redrawn with \r, at most 4 times/s
	HTTPClient    *http.Client    // nil = a default with sane timeouts
}

// DefaultConcurrency is the in-flight bound used when Config.Concurrency is
// not positive.
const DefaultConcurrency = 64

// Result is what one Run measured.
type Result struct {
	Name             string         `json:"name"`
	Requests         int            `json:"requests"` // completed OK
	Errors           int            `json:"errors"`
	ErrorsByKind     map[string]int `json:"errors_by_kind"` // "http_503", "connect", "stream_cut", "timeout", "stream_error", "canceled"
	HitRatio         float64        `json:"hit_ratio"`      // Σ cached_tokens / Σ prompt_tokens, as the engines reported in usage
	TTFTP50Ms        float64        `json:"ttft_p50_ms"`    // first streamed content token
	TTFTP90Ms        float64        `json:"ttft_p90_ms"`
	TTFTP99Ms        float64        `json:"ttft_p99_ms"`
	MeanTTFTMs       float64        `json:"mean_ttft_ms"`
	Goodput          float64        `json:"goodput_rps"` // completed requests per second of wall time
	OutputTokensPerS float64        `json:"output_tokens_per_s"`
	WallSeconds      float64        `json:"wall_seconds"`
	PromptTokens     int64          `json:"prompt_tokens"`      // Σ usage.prompt_tokens over completed requests
	CachedTokens     int64          `json:"cached_tokens"`      // Σ usage.prompt_tokens_details.cached_tokens
	NoUsage          int            `json:"no_usage"`           // completed requests whose stream carried no usage
	QueuedRequests   int            `json:"queued_requests"`    // arrivals that found Concurrency requests in flight
	MeanQueueWaitMs  float64        `json:"mean_queue_wait_ms"` // mean over queued arrivals of the wait for a slot
	MaxQueueWaitMs   float64        `json:"max_queue_wait_ms"`  // longest such wait
	TTFTsMs          []float64      `json:"-"`                  // raw samples for the report
}

// Run replays cfg.Requests in open loop: request i is sent at
// Arrival/Speedup after the start (later if Concurrency requests are in
// flight) to cfg.Frontends[i%len]. Request errors are counted by kind and
// never stop the run. When ctx is cancelled Run stops issuing, cancels the
// requests in flight and returns what it measured together with ctx's error.
func Run(ctx context.Context, name string, cfg Config) (Result, error) {
	if len(cfg.Frontends) == 0 {
		return Result{Name: name, ErrorsByKind: map[string]int{}}, errors.New("bench: no front ends")
	}
	if cfg.Speedup <= 0 {
		cfg.Speedup = 1
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.BytesPerToken <= 0 {
		cfg.BytesPerToken = trace.DefaultBytesPerToken
	}
	reqs := cfg.Requests
	if cfg.MaxRequests > 0 && len(reqs) > cfg.MaxRequests {
		reqs = reqs[:cfg.MaxRequests]
	}
	client := cfg.HTTPClient
	if client == nil {
		client = DefaultHTTPClient(cfg.Concurrency)
	}
	frontends := make([]string, len(cfg.Frontends))
	for i, f := range cfg.Frontends {
		frontends[i] = strings.TrimRight(f, "/") + "/v1/chat/completions"
	}

	col := newCollector(len(reqs))
	start := time.Now()
	col.start = start

	stopProgress := func() {}
	if cfg.Progress != nil {
		stopProgress = startProgress(cfg.Progress, col)
	}

	var wg sync.WaitGroup
	sem := make(chan struct{}, cfg.Concurrency)
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = start.Add(cfg.Duration)
	}

dispatch:
	for i, r := range reqs {
		due := start.Add(time.Duration(float64(r.Arrival) / cfg.Speedup))
		if !deadline.IsZero() && !due.Before(deadline) {
			break
		}
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				timer.Stop()
				break dispatch
			case <-timer.C:
			}
		}
		select {
		case sem <- struct{}{}:
		default:
			// All slots busy: the arrival waits, which an open-loop client
			// must report rather than hide.
			select {
			case sem <- struct{}{}:
				col.queued(time.Since(due))
			case <-ctx.Done():
				break dispatch
			}
		}
		if ctx.Err() != nil || (!deadline.IsZero() && !time.Now().Before(deadline)) {
			<-sem // waited past the end for a slot: not issued
			break
		}
		col.issued()
		wg.Add(1)
		go func(url string, r trace.Request) {
			defer wg.Done()
			defer func() { <-sem }()
			col.add(doRequest(ctx, client, url, cfg.Model, r, cfg.BytesPerToken))
		}(frontends[i%len(frontends)], r)
	}
	wg.Wait()
	stopProgress()
	res := col.result(name, time.Since(start))
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("bench %s: %w", name, err)
	}
	return res, nil
}

// DefaultHTTPClient is the client Run uses when Config.HTTPClient is nil:
// enough idle connections per host for the concurrency (so connections are
// reused, not churned), a short dial timeout, and generous header and total
// timeouts because a long prompt may queue behind others before its prefill.
func DefaultHTTPClient(concurrency int) *http.Client {
	if concurrency <= 0 {
		concurrency = DefaultConcurrency
	}
	return &http.Client{
		Timeout: 10 * time.Minute,
		Transport: &http.Transport{
			Proxy:                 nil, // benchmarks talk to the endpoints directly
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          0,
			MaxIdleConnsPerHost:   concurrency,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 5 * time.Minute,
			DisableCompression:    true, // SSE is latency-sensitive; gzip would buffer
		},
	}
}
