// Package health checks the replicas a router declares: each replica's
// health endpoint, model list, engine load (/metrics) and engine info,
// read through an engine adapter, and reported to the router's owner only
// when something changed. Failures the request path sees count like
// failed checks.
package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/engine"
	"github.com/kvmesh/kvmesh/internal/panics"
	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Size limits of what the checker reads from a replica.
const (
	maxModelsBytes  = 1 << 20
	maxInfoBytes    = 1 << 20
	maxHealthBytes  = 64 << 10
	maxMetricsBytes = 8 << 20
)

// Config tunes the active health checks of a router's replicas.
type Config struct {
	// Interval between health checks (the engine's health endpoint and
	// GET /v1/models; default 2s).
	Interval time.Duration
	// LoadInterval between scrapes of a healthy replica's /metrics for
	// its running and waiting requests (default 1s: the load rule wants
	// fresh counts; the router's own in-flight count covers the gaps).
	LoadInterval time.Duration
	// InfoInterval between reads of the engine's info endpoint (slots,
	// cache size; default 30s: they change only on restart).
	InfoInterval time.Duration
	// Timeout of one request to a replica (default 1s).
	Timeout time.Duration
	// FailThreshold consecutive failures eject a healthy replica (default 3).
	FailThreshold int
	// PassThreshold consecutive passes re-admit an ejected one (default 2).
	// A replica never admitted is admitted at its first pass.
	PassThreshold int
	// BytesPerToken is a replica's bytes of canonical text per engine
	// token, which converts its engine's cache tokens into router blocks
	// (tokens.go; nil: DefaultBytesPerToken).
	BytesPerToken func(replica string) float64
	// Engine is the kind of engine behind every replica; "" or auto
	// detects each replica's from its /metrics.
	Engine engine.Kind
	// Panics counts the panics of a poll (an adapter meeting metrics it
	// did not expect): the poll is dropped and its replica polled again
	// at the next tick. Default: a recorder of its own, not registered.
	Panics *panics.Recorder
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = 2 * time.Second
	}
	if c.LoadInterval <= 0 {
		c.LoadInterval = time.Second
	}
	if c.InfoInterval <= 0 {
		c.InfoInterval = 30 * time.Second
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
	if c.BytesPerToken == nil {
		c.BytesPerToken = func(string) float64 { return DefaultBytesPerToken }
	}
	if c.Engine == "" {
		c.Engine = engine.Auto
	}
	return c
}

// ReplicaStatus is the health checker's report on one replica, the type
// the mesh takes (engine.ReplicaStatus).
type ReplicaStatus = engine.ReplicaStatus

// Checker checks the replicas declared at this router, each in its
// own loop: the engine's health endpoint and model list every Interval,
// its load (/metrics) every LoadInterval while it is healthy, and its info
// endpoint every InfoInterval, through an engine adapter (fixed, or
// detected per replica from /metrics). It tells its owner through
// onChange, only when something changed. Passive failures seen on the
// request path count like failed checks.
//
// The replica set is dynamic (SetReplicas): a new replica is reported
// only once it passes a check (admission); a removed one stops being
// checked and is never reported again.
//
// Learned slots: vLLM and TGI 3 publish no concurrency limit. For them
// the checker takes the most sequences it saw running in a scrape that
// also showed requests waiting: an engine that queues while running n has
// reached its limit at n (max_num_seqs, or the room in its KV cache,
// which caps it as well). Later scrapes that run more raise it; a full
// cache that runs fewer for a while does not lower it. Until the engine
// has queued once, Slots is 0 (unknown), and the report's MinSlots is the
// most sequences it saw running with nothing waiting (at most 255): the
// engine has at least that many slots, which spares a replica running
// fewer the hot-spot guard's in-flight bound (route.EngineLoad.MinSlots).
type Checker struct {
	cfg        Config
	client     *http.Client
	onChange   func(id string, s ReplicaStatus)
	blockBytes int
	log        hclog.Logger
	healthy    *prometheus.GaugeVec
	requests   *prometheus.GaugeVec
	slots      *prometheus.GaugeVec
	engineInfo *prometheus.GaugeVec
	lora       loraGauges
	ejections  *prometheus.CounterVec
	rounds     atomic.Int64
	ready      atomic.Bool

	mu      sync.Mutex // guards the fields below and serialises onChange
	state   map[string]*replicaHealth
	running bool            // Run is active: SetReplicas starts loops
	started bool            // checks began (Run or round): readiness may latch
	runCtx  context.Context // Run's context, for loops started later
	wg      sync.WaitGroup  // the replicas' loops
}

type replicaHealth struct {
	adapter                   engine.Adapter // nil until detected
	healthy, ejected, checked bool
	admitted, warned          bool
	fails, passes             int
	models                    engine.ModelList
	metrics, info             engine.Stats
	learnedSlots              int32
	ranFree                   int32         // most sequences seen running with nothing waiting
	uptime                    engine.Uptime // the last scrape's that had any (restart.go)
	bytesPerToken             float64       // the ratio CapacityBlocks is in (tokens.go)
	restarts                  int
	lastHealth, lastInfo      time.Time
	lastLoad                  time.Time
	last                      ReplicaStatus // what onChange was last told
	shownEngine               string        // the engine label of kvmesh_replica_engine_info
	shownLoRA                 route.LoRAs   // what the LoRA series show (lora.go)
	// The sum of the engine's progress counters (stall.go): its last
	// value, whether it publishes any, when it was scraped, and the
	// earliest it can have last moved; stalled: ejected by Stall at
	// stalledAt, and not re-admitted since.
	progress                             float64
	progressKnown, stalled               bool
	progressAt, progressMoved, stalledAt time.Time
	answeredAt                           time.Time // a probe's token, while stalled
	stop                                 context.CancelFunc
	// kick asks the replica's loop for a load scrape now (ProbeLoad);
	// made with the loop, one pending at most. probing: the loop has a
	// probe's next read pending (probe.go); probeWant: the requests the
	// router last said it has in flight there.
	kick      chan struct{}
	probing   bool
	probeWant int32
}

// New returns a checker of replicas (their base URLs). onChange
// is called, serialised, with a replica's new status; it must not call back
// into the checker. blockBytes is the contract's block size. A nil client
// is upstream.NewClient's.
func New(cfg Config, replicas []string, client *http.Client, onChange func(id string, s ReplicaStatus), blockBytes int, logger hclog.Logger, reg prometheus.Registerer) *Checker {
	if client == nil {
		client = upstream.NewClient()
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if onChange == nil {
		onChange = func(string, ReplicaStatus) {}
	}
	f := promauto.With(reg)
	if cfg.Panics == nil {
		cfg.Panics = panics.New(nil, logger)
	}
	h := &Checker{
		cfg: cfg.withDefaults(), client: client, onChange: onChange,
		blockBytes: max(blockBytes, 1), log: logger, state: map[string]*replicaHealth{},
		healthy: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_replica_healthy",
			Help: "Whether each replica declared at this router passes its health checks (1) or not (0).",
		}, []string{"replica"}),
		requests: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_replica_engine_requests",
			Help: "Requests running and waiting in each replica's engine, as its metrics last said.",
		}, []string{"replica", "state"}),
		slots: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_replica_engine_slots",
			Help: "Sequences each replica's engine runs at once, published or learned (0: unknown).",
		}, []string{"replica"}),
		// An info gauge (always 1) so dashboards and the real-engine
		// suites can tell which adapter reads each replica: detection
		// that falls back to "openai" leaves the router blind to load.
		engineInfo: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_replica_engine_info",
			Help: "The engine each replica runs, as detected or configured (value 1; engine \"openai\": none recognised).",
		}, []string{"replica", "engine"}),
		lora: newLoRAGauges(f),
		ejections: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_replica_ejections_total",
			Help: "Replicas declared at this router ejected, by reason: failed_checks (health checks or requests failing) or stalled (requests in flight got no byte for the stall window past the prefill expected of them, and the engine's progress counters stood still).",
		}, []string{"reason"}),
	}
	for _, r := range []string{ReasonFailedChecks, ReasonStalled} {
		h.ejections.WithLabelValues(r) // both series from the start, at 0
	}
	h.SetReplicas(replicas)
	return h
}

// SetReplicas makes ids the set of replicas checked. New ones are checked
// at once (when Run is active) and reported once they pass; removed ones
// stop being checked, and once SetReplicas returns onChange is not called
// for them again.
func (h *Checker) SetReplicas(ids []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	keep := make(map[string]bool, len(ids))
	for _, id := range ids {
		keep[id] = true
		if h.state[id] != nil {
			continue
		}
		s := &replicaHealth{}
		if h.cfg.Engine != engine.Auto {
			s.adapter, _ = engine.For(h.cfg.Engine)
		}
		h.state[id] = s
		h.healthy.WithLabelValues(id).Set(0)
		if h.running {
			h.startLocked(id, s)
		}
	}
	for id, s := range h.state {
		if keep[id] {
			continue
		}
		if s.stop != nil {
			s.stop()
		}
		delete(h.state, id)
		h.healthy.DeleteLabelValues(id)
		h.slots.DeleteLabelValues(id)
		h.engineInfo.DeletePartialMatch(prometheus.Labels{"replica": id})
		h.requests.DeletePartialMatch(prometheus.Labels{"replica": id})
		h.lora.forget(id)
		h.log.Info("replica no longer checked", "replica", id)
	}
	h.updateReadyLocked()
}

// Replicas returns the replicas checked, sorted.
func (h *Checker) Replicas() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.state))
	for id := range h.state {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Run checks every replica, each in its own loop, until ctx is done, and
// returns once every loop has stopped.
func (h *Checker) Run(ctx context.Context) {
	h.mu.Lock()
	h.running, h.runCtx, h.started = true, ctx, true
	for id, s := range h.state {
		h.startLocked(id, s)
	}
	h.updateReadyLocked()
	h.mu.Unlock()
	<-ctx.Done()
	h.mu.Lock()
	h.running = false
	for _, s := range h.state {
		if s.stop != nil {
			s.stop()
			s.stop = nil
		}
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// startLocked starts replica id's loop; h.mu is held.
func (h *Checker) startLocked(id string, s *replicaHealth) {
	ctx, stop := context.WithCancel(h.runCtx)
	s.stop = stop
	if s.kick == nil {
		s.kick = make(chan struct{}, 1)
	}
	kick := s.kick
	h.wg.Go(func() { h.loop(ctx, id, s, kick) })
}

// Ready reports whether every replica known when the checks began has
// had its first check (at once for an empty set: a router whose replicas
// come from discovery is ready before the first answer). Once true it
// stays true, so replicas discovered later do not flap readiness.
func (h *Checker) Ready() bool { return h.ready.Load() }

// updateReadyLocked latches readiness; h.mu is held.
func (h *Checker) updateReadyLocked() {
	if h.ready.Load() || !h.started {
		return
	}
	for _, s := range h.state {
		if !s.checked {
			return
		}
	}
	h.ready.Store(true)
}

// ReportFailure counts a passive failure of replica id (a refused
// connection, a 5xx, a stream that broke) like a failed check.
func (h *Checker) ReportFailure(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state[id]
	if s == nil {
		return
	}
	h.fail(id, s, "passive failure")
}

// round checks every replica once, fully and at once (tests).
func (h *Checker) round(ctx context.Context) {
	h.mu.Lock()
	h.started = true
	states := make(map[string]*replicaHealth, len(h.state))
	for id, s := range h.state {
		states[id] = s
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for id, s := range states {
		wg.Go(func() { h.cfg.Panics.Guard(panics.HealthCheck, func() { h.poll(ctx, id, s, true, false) }) })
	}
	wg.Wait()
	if ctx.Err() == nil {
		h.rounds.Add(1)
	}
}

// pollResult is what one poll read, applied under h.mu.
type pollResult struct {
	now                     time.Time
	adapter                 engine.Adapter
	healthChecked, healthOK bool
	healthErr               error
	models                  engine.ModelList
	metrics                 engine.Stats
	scraped, infoTried      bool
	scrapeFailed            bool
	infoRead                bool
	info                    engine.Stats
	uptime                  engine.Uptime
	answered                bool // a stalled replica's probe got its token (stall.go)
}

// poll does what is due for replica id (everything when force): its
// health check, its load scrape (also when kicked by ProbeLoad), its
// info read.
func (h *Checker) poll(ctx context.Context, id string, s *replicaHealth, force, kicked bool) {
	now := time.Now()
	h.mu.Lock()
	if h.state[id] != s {
		h.mu.Unlock()
		return
	}
	tick := min(h.cfg.LoadInterval, h.cfg.Interval)
	healthDue := force || !s.checked || due(now.Sub(s.lastHealth), h.cfg.Interval, tick)
	loadDue := s.healthy && (kicked || due(now.Sub(s.lastLoad), h.cfg.LoadInterval, tick))
	infoDue := force || due(now.Sub(s.lastInfo), h.cfg.InfoInterval, tick)
	r := pollResult{now: now, adapter: s.adapter}
	healthy := s.healthy
	probe := "" // the model a replica ejected as stalled is asked a token of
	if s.stalled {
		if bases := s.models.Bases(); len(bases) > 0 {
			probe = bases[0]
		}
	}
	h.mu.Unlock()

	base := strings.TrimRight(id, "/")
	detecting := r.adapter == nil
	if (healthDue || loadDue) && (detecting || r.adapter.Kind() != engine.Generic) {
		if fams, err := h.fetchMetrics(ctx, base); err == nil || len(fams) > 0 {
			if err == nil {
				r.uptime = engine.ReadUptime(fams)
			}
			if detecting {
				if k, ok := engine.Detect(fams); ok {
					r.adapter, _ = engine.For(k)
					h.log.Info("engine detected", "replica", id, "engine", string(k))
				}
			}
			if r.adapter != nil {
				r.metrics, r.scraped = r.adapter.FromMetrics(fams), true
			}
		} else {
			r.scrapeFailed = true
			h.log.Debug("reading engine metrics", "replica", id, "error", err)
		}
	}
	a := r.adapter
	if a == nil {
		// Not detected (yet): an OpenAI-compatible server; detection is
		// tried again at the next check.
		a, _ = engine.For(engine.Generic)
	}
	if healthDue {
		r.healthChecked = true
		r.models, r.healthErr = h.checkHealth(ctx, base, a)
		r.healthOK = r.healthErr == nil
		if r.healthOK && probe != "" {
			r.answered = h.probe(ctx, id, base, probe)
		}
		if ctx.Err() != nil {
			return
		}
	}
	if p := a.InfoPath(); p != "" && infoDue && (r.healthOK || healthy) {
		r.infoTried = true
		b, err := h.get(ctx, base+p, maxInfoBytes, "")
		if err == nil {
			r.info, err = a.FromInfo(b)
		}
		if err != nil {
			h.log.Debug("reading engine info", "replica", id, "error", err)
		} else {
			r.infoRead = true
		}
	}
	if ctx.Err() != nil {
		return
	}
	h.apply(id, s, r)
}

// apply records one poll's findings and reports any change.
func (h *Checker) apply(id string, s *replicaHealth, r pollResult) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state[id] != s {
		return // removed meanwhile
	}
	if s.adapter == nil && r.adapter != nil {
		s.adapter = r.adapter
	}
	if r.scrapeFailed {
		// The last counts are of an engine that no longer answers its
		// /metrics: unknown until a scrape succeeds again. What else
		// it published (slots, cache size) does not change with load.
		s.metrics = s.metrics.Forget()
	}
	h.noteUptimeLocked(id, s, r.uptime)
	h.noteProgressLocked(s, r)
	if r.answered {
		s.answeredAt = r.now
	}
	if r.scraped {
		s.metrics, s.lastLoad = r.metrics, r.now
		s.learn(id, h.log)
	}
	if r.infoTried {
		s.lastInfo = r.now // a missing info endpoint is not asked every second
	}
	if r.infoRead {
		s.info = r.info
	}
	if r.healthChecked {
		s.checked, s.lastHealth = true, r.now
		if r.healthErr != nil {
			h.fail(id, s, r.healthErr.Error())
		} else {
			s.fails = 0
			if h.progressedLocked(s) {
				s.passes++
			}
			s.models = r.models
			if !s.healthy && (!s.ejected || s.passes >= h.cfg.PassThreshold) {
				if s.ejected {
					h.readmittedLocked(id, s)
				}
				s.healthy, s.ejected, s.admitted, s.stalled = true, false, true, false
				h.log.Info("replica admitted", "replica", id, "engine", h.kindLocked(s), "models", strings.Join(r.models.Models, ","))
			}
		}
		h.updateReadyLocked()
	}
	h.notify(id, s)
}

// fail counts one failure; h.mu is held.
func (h *Checker) fail(id string, s *replicaHealth, why string) {
	s.passes = 0
	s.fails++
	switch {
	case !s.admitted:
		if !s.warned {
			h.log.Warn("replica not admitted: failing its health check", "replica", id, "error", why)
			s.warned = true
		}
	case s.healthy && s.fails >= h.cfg.FailThreshold:
		h.log.Warn("replica unhealthy", "replica", id, "reason", ReasonFailedChecks, "error", why)
		s.healthy, s.ejected = false, true
		h.ejections.WithLabelValues(ReasonFailedChecks).Inc()
	}
	h.notify(id, s)
}

// Engine is the engine the checker detected (or was told) replica id
// runs; "" until it knows (the replica unknown or not yet checked).
func (h *Checker) Engine(id string) engine.Kind {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.state[id]; s != nil && s.adapter != nil {
		return s.adapter.Kind()
	}
	return ""
}

func (h *Checker) kindLocked(s *replicaHealth) string {
	if s.adapter == nil {
		return string(engine.Generic)
	}
	return string(s.adapter.Kind())
}

// statusLocked is s as reported; h.mu is held.
func (h *Checker) statusLocked(s *replicaHealth) ReplicaStatus {
	st := s.metrics.Merge(s.info)
	out := ReplicaStatus{Models: s.models.Models, Healthy: s.healthy, Engine: h.kindLocked(s), Load: st.EngineLoad, Restarts: s.restarts,
		LoRA: engine.LoRAsOf(st.LoRA, s.models), Role: st.Role, Bootstrap: st.Bootstrap}
	if out.Load.Slots == 0 {
		out.Load.Slots = s.learnedSlots
	}
	if out.Load.Slots == 0 && out.Load.MinSlots == 0 {
		out.Load.MinSlots = uint8(min(s.ranFree, math.MaxUint8))
	}
	if st.CacheTokens > 0 {
		c := float64(st.CacheTokens) * s.bytesPerToken / float64(h.blockBytes)
		out.CapacityBlocks = int(min(c, summary.MaxCapacityBlocks))
	}
	return out
}

// notify reports s if it changed since the last report; h.mu is held.
// A replica not yet admitted is not reported.
func (h *Checker) notify(id string, s *replicaHealth) {
	h.ratioLocked(id, s)
	st := h.statusLocked(s)
	healthy := 0.0
	if st.Healthy {
		healthy = 1
	}
	h.healthy.WithLabelValues(id).Set(healthy)
	h.requests.WithLabelValues(id, "running").Set(float64(st.Load.Running))
	h.requests.WithLabelValues(id, "waiting").Set(float64(st.Load.Waiting))
	h.slots.WithLabelValues(id).Set(float64(st.Load.Slots))
	h.lora.show(id, st, &s.shownLoRA)
	if s.shownEngine != st.Engine {
		h.engineInfo.DeletePartialMatch(prometheus.Labels{"replica": id})
		h.engineInfo.WithLabelValues(id, st.Engine).Set(1)
		s.shownEngine = st.Engine
	}
	if !s.admitted || st.Equal(s.last) {
		return
	}
	s.last = st
	st.Models = slices.Clone(st.Models)
	h.onChange(id, st)
}

// checkHealth reads the adapter's health endpoint, then the model list.
func (h *Checker) checkHealth(ctx context.Context, base string, a engine.Adapter) (engine.ModelList, error) {
	if p := a.HealthPath(); p != "" {
		if _, err := h.get(ctx, base+p, maxHealthBytes, ""); err != nil {
			return engine.ModelList{}, err
		}
	}
	b, err := h.get(ctx, base+"/v1/models", maxModelsBytes, "")
	if err != nil {
		return engine.ModelList{}, err
	}
	models, err := engine.ParseModels(b)
	if err != nil {
		return engine.ModelList{}, fmt.Errorf("GET %s/v1/models: %w", base, err)
	}
	return models, nil
}

// fetchMetrics reads and parses the replica's /metrics, asking for the
// text format (engines built on prometheus_client would otherwise be free
// to answer in OpenMetrics or protobuf).
func (h *Checker) fetchMetrics(ctx context.Context, base string) (engine.Families, error) {
	b, err := h.get(ctx, base+"/metrics", maxMetricsBytes, "text/plain;version=0.0.4")
	if err != nil {
		return nil, err
	}
	return engine.ParseMetrics(b)
}

// errTooLarge marks a body over its limit.
var errTooLarge = errors.New("body over its size limit")

// get reads url within the check timeout and limit bytes.
func (h *Checker) get(ctx context.Context, url string, limit int64, accept string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
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
	if resp.ContentLength > limit {
		return nil, fmt.Errorf("GET %s: %w (%d > %d bytes)", url, errTooLarge, resp.ContentLength, limit)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("GET %s: %w (over %d bytes)", url, errTooLarge, limit)
	}
	return b, nil
}
