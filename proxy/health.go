package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// HealthConfig tunes the active health checks of a router's replicas.
type HealthConfig struct {
	// Interval between check rounds (default 2s).
	Interval time.Duration
	// Timeout of one check (default 1s).
	Timeout time.Duration
	// FailThreshold consecutive failures eject a healthy replica (default 3).
	FailThreshold int
	// PassThreshold consecutive passes re-admit an ejected one (default 2).
	// A replica never seen failing is admitted at its first pass.
	PassThreshold int
	// BytesPerToken converts engine cache tokens into router blocks
	// (default 4).
	BytesPerToken int
	// MetricsInterval is how often the engine's /metrics is read for its
	// cache size (default 30s).
	MetricsInterval time.Duration
}

func (c HealthConfig) withDefaults() HealthConfig {
	if c.Interval <= 0 {
		c.Interval = 2 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.FailThreshold <= 0 {
		c.FailThreshold = 3
	}
	if c.PassThreshold <= 0 {
		c.PassThreshold = 2
	}
	if c.BytesPerToken <= 0 {
		c.BytesPerToken = 4
	}
	if c.MetricsInterval <= 0 {
		c.MetricsInterval = 30 * time.Second
	}
	return c
}

// HealthChecker checks the replicas declared at this router: their model
// list (GET /v1/models) every Interval and their cache size (vLLM's
// vllm:cache_config_info on GET /metrics) now and then. It tells the mesh
// through onChange, only when something changed. Passive failures seen on
// the request path count like failed checks.
type HealthChecker struct {
	cfg        HealthConfig
	replicas   []string
	client     *http.Client
	onChange   func(id string, models []string, healthy bool, capacityBlocks int)
	blockBytes int
	log        hclog.Logger
	healthy    *prometheus.GaugeVec
	rounds     atomic.Int64

	mu    sync.Mutex // guards state and serialises onChange
	state map[string]*replicaHealth
}

type replicaHealth struct {
	healthy, ejected, reported bool
	fails, passes              int
	models                     []string
	capacity                   int
	scraped                    time.Time
	last                       lastReport // what onChange was last told
}

// lastReport is the state a replica was last reported in.
type lastReport struct {
	healthy  bool
	models   []string
	capacity int
}

// NewHealthChecker returns a checker of replicas (their base URLs). onChange
// is called, serialised, with a replica's new state; it must not call back
// into the checker. blockBytes is the contract's block size.
func NewHealthChecker(cfg HealthConfig, replicas []string, client *http.Client, onChange func(id string, models []string, healthy bool, capacityBlocks int), blockBytes int, logger hclog.Logger, reg prometheus.Registerer) *HealthChecker {
	if client == nil {
		client = NewClient()
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if onChange == nil {
		onChange = func(string, []string, bool, int) {}
	}
	h := &HealthChecker{
		cfg: cfg.withDefaults(), replicas: slices.Clone(replicas), client: client, onChange: onChange,
		blockBytes: max(blockBytes, 1), log: logger, state: make(map[string]*replicaHealth, len(replicas)),
		healthy: promauto.With(reg).NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_replica_healthy",
			Help: "Whether each replica declared at this router passes its health checks (1) or not (0).",
		}, []string{"replica"}),
	}
	for _, id := range h.replicas {
		h.state[id] = &replicaHealth{}
		h.healthy.WithLabelValues(id).Set(0)
	}
	return h
}

// Run checks every replica each Interval until ctx is done.
func (h *HealthChecker) Run(ctx context.Context) {
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	for {
		h.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Ready reports whether the first round of checks is complete.
func (h *HealthChecker) Ready() bool { return h.rounds.Load() > 0 }

// ReportFailure counts a passive failure of replica id (a refused
// connection, a 5xx, a stream that broke) like a failed check.
func (h *HealthChecker) ReportFailure(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state[id]
	if s == nil {
		return
	}
	h.fail(id, s, "passive failure")
}

func (h *HealthChecker) round(ctx context.Context) {
	var wg sync.WaitGroup
	for _, id := range h.replicas {
		wg.Go(func() { h.check(ctx, id) })
	}
	wg.Wait()
	if ctx.Err() == nil {
		h.rounds.Add(1)
	}
}

func (h *HealthChecker) check(ctx context.Context, id string) {
	models, err := h.fetchModels(ctx, id)
	if ctx.Err() != nil {
		return
	}
	h.mu.Lock()
	scrape := err == nil && time.Since(h.state[id].scraped) >= h.cfg.MetricsInterval
	h.mu.Unlock()
	capacity, scraped := 0, false
	if scrape {
		capacity, scraped = h.fetchCapacity(ctx, id)
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state[id]
	if err != nil {
		h.fail(id, s, err.Error())
		return
	}
	s.fails = 0
	s.passes++
	s.models = models
	if scraped {
		s.capacity, s.scraped = capacity, time.Now()
	}
	if !s.healthy && (!s.ejected || s.passes >= h.cfg.PassThreshold) {
		s.healthy, s.ejected = true, false
		h.log.Info("replica admitted", "replica", id, "models", strings.Join(models, ","))
	}
	h.notify(id, s)
}

// fail counts one failure; h.mu is held.
func (h *HealthChecker) fail(id string, s *replicaHealth, why string) {
	s.passes = 0
	s.fails++
	if (s.healthy && s.fails >= h.cfg.FailThreshold) || !s.reported {
		if s.healthy || !s.reported {
			h.log.Warn("replica unhealthy", "replica", id, "error", why)
		}
		s.healthy, s.ejected = false, true
	}
	h.notify(id, s)
}

// notify reports s if it changed since the last report; h.mu is held.
func (h *HealthChecker) notify(id string, s *replicaHealth) {
	g := h.healthy.WithLabelValues(id)
	if s.healthy {
		g.Set(1)
	} else {
		g.Set(0)
	}
	if s.reported && s.healthy == s.last.healthy && slices.Equal(s.models, s.last.models) && s.capacity == s.last.capacity {
		return
	}
	s.reported = true
	s.last = lastReport{healthy: s.healthy, models: s.models, capacity: s.capacity}
	h.onChange(id, slices.Clone(s.models), s.healthy, s.capacity)
}

// modelsResponse is the OpenAI GET /v1/models response, as far as read.
type modelsResponse struct {
	Data []struct {
		ID string `json:"id"`
	} `json:"data"`
}

func (h *HealthChecker) get(ctx context.Context, url string, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return b, nil
}

// fetchModels lists the models the replica serves, sorted.
func (h *HealthChecker) fetchModels(ctx context.Context, id string) ([]string, error) {
	url := strings.TrimRight(id, "/") + "/v1/models"
	b, err := h.get(ctx, url, 1<<20)
	if err != nil {
		return nil, err
	}
	var l modelsResponse
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	models := make([]string, 0, len(l.Data))
	for _, m := range l.Data {
		if m.ID != "" {
			models = append(models, m.ID)
		}
	}
	slices.Sort(models)
	return slices.Compact(models), nil
}

// fetchCapacity reads the engine's KV cache size in router blocks: 0 when
// the engine does not export vllm:cache_config_info (the mesh then uses its
// default); ok is false when the metrics could not be read at all.
func (h *HealthChecker) fetchCapacity(ctx context.Context, id string) (blocks int, ok bool) {
	b, err := h.get(ctx, strings.TrimRight(id, "/")+"/metrics", 16<<20)
	if err != nil {
		h.log.Debug("reading engine metrics", "replica", id, "error", err)
		return 0, false
	}
	blockSize, numBlocks, found := parseCacheConfig(b)
	if !found {
		return 0, true
	}
	tokens := float64(blockSize) * float64(numBlocks)
	c := tokens * float64(h.cfg.BytesPerToken) / float64(h.blockBytes)
	return int(min(c, summary.MaxCapacityBlocks)), true
}

// parseCacheConfig finds vLLM's cache_config_info in a Prometheus text
// exposition and returns its block_size and num_gpu_blocks labels.
func parseCacheConfig(text []byte) (blockSize, numBlocks int64, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		rest, found := bytes.CutPrefix(line, []byte("vllm:cache_config_info{"))
		if !found {
			continue
		}
		labels, found := parseLabels(rest)
		if !found {
			continue
		}
		bs, err1 := strconv.ParseInt(labels["block_size"], 10, 64)
		nb, err2 := strconv.ParseInt(labels["num_gpu_blocks"], 10, 64)
		if err1 != nil || err2 != nil || bs <= 0 || nb <= 0 || bs > 1<<20 || nb > 1<<40 {
			continue
		}
		return bs, nb, true
	}
	return 0, 0, false
}

// parseLabels parses `name="value",...}` (the text after the opening
// brace) with the exposition format's escapes.
func parseLabels(b []byte) (map[string]string, bool) {
	labels := map[string]string{}
	for {
		b = bytes.TrimLeft(b, " ,")
		if len(b) == 0 {
			return nil, false
		}
		if b[0] == '}' {
			return labels, true
		}
		eq := bytes.IndexByte(b, '=')
		if eq <= 0 || eq+1 >= len(b) || b[eq+1] != '"' {
			return nil, false
		}
		name := string(bytes.TrimSpace(b[:eq]))
		b = b[eq+2:]
		var v []byte
		closed := false
		for i := 0; i < len(b); i++ {
			c := b[i]
			if c == '\\' && i+1 < len(b) {
				i++
				switch b[i] {
				case 'n':
					v = append(v, '\n')
				default:
					v = append(v, b[i])
				}
				continue
			}
			if c == '"' {
				b, closed = b[i+1:], true
				break
			}
			v = append(v, c)
		}
		if !closed {
			return nil, false
		}
		labels[name] = string(v)
	}
}
