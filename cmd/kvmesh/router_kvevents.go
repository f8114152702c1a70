package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/kvevents"
	"github.com/kvmesh/kvmesh/internal/kvtrack"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/prometheus/client_golang/prometheus"
)

// kvEventsFlag is --kv-events, repeatable:
//
//	--kv-events auto
//	    every replica this router declares whose GET /kv_event_sources
//	    names a ZMQ publisher (vLLM serves its --kv-events-config there;
//	    a wildcard host is the replica's own host);
//	--kv-events REPLICA_URL=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=TOPIC]
//	    that replica's publisher, given.
//
// vLLM must bind its publisher (endpoint "tcp://*:PORT"): the router
// connects.
type kvEventsFlag struct {
	auto  bool
	given map[string]kvevents.Config
}

func (f *kvEventsFlag) String() string {
	if f == nil {
		return ""
	}
	parts := []string{}
	if f.auto {
		parts = append(parts, "auto")
	}
	for id, c := range f.given {
		parts = append(parts, id+"="+c.Endpoint)
	}
	return strings.Join(parts, " ")
}

func (f *kvEventsFlag) Set(v string) error {
	if v == "auto" {
		f.auto = true
		return nil
	}
	id, spec, ok := strings.Cut(v, "=tcp://")
	if !ok || id == "" {
		return fmt.Errorf("--kv-events %q: want auto or REPLICA_URL=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=TOPIC]", v)
	}
	fields := strings.Split(spec, ",")
	c := kvevents.Config{Endpoint: "tcp://" + fields[0]}
	for _, kv := range fields[1:] {
		k, val, _ := strings.Cut(kv, "=")
		switch k {
		case "replay":
			c.Replay = val
		case "topic":
			c.Topic = val
		default:
			return fmt.Errorf("--kv-events %q: unknown option %q (replay, topic)", v, k)
		}
	}
	if _, err := kvevents.New(c, nil); err != nil {
		return fmt.Errorf("--kv-events %q: %w", v, err)
	}
	id = strings.TrimRight(id, "/")
	if f.given == nil {
		f.given = map[string]kvevents.Config{}
	}
	f.given[id] = c
	return nil
}

func (f *kvEventsFlag) on() bool { return f.auto || len(f.given) > 0 }

// kvEvents runs one subscription and tracker per declared replica whose
// engine publishes KV events, and hands the proxy's answers to the
// trackers. It owns their goroutines.
type kvEvents struct {
	flag   kvEventsFlag
	sums   kvtrack.Summaries
	client *http.Client
	log    hclog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	subs map[string]*kvSub
	desc map[string]*prometheus.Desc
}

type kvSub struct {
	sub    *kvevents.Subscriber
	tr     *kvtrack.Tracker
	cancel context.CancelFunc
}

func newKVEvents(flag kvEventsFlag, sums kvtrack.Summaries, client *http.Client, log hclog.Logger) *kvEvents {
	ctx, cancel := context.WithCancel(context.Background())
	k := &kvEvents{flag: flag, sums: sums, client: client, log: log, ctx: ctx, cancel: cancel, subs: map[string]*kvSub{}}
	k.desc = map[string]*prometheus.Desc{}
	for name, help := range map[string]string{
		"kvmesh_kv_events_total":                    "KV-cache events received from each replica's engine.",
		"kvmesh_kv_event_batches_total":             "KV-event batches received from each replica's engine.",
		"kvmesh_kv_event_gaps_total":                "Jumps in a replica's KV-event sequence (batches lost on the way).",
		"kvmesh_kv_event_replayed_total":            "KV-event batches brought back by the replay endpoint.",
		"kvmesh_kv_event_resyncs_total":             "KV events lost for good (a gap no replay filled, a restarted engine, a malformed batch): the replica's summary falls back to prediction for what came before.",
		"kvmesh_kv_event_reconnects_total":          "KV-event connections lost and redialled.",
		"kvmesh_kv_event_lag_seconds":               "Age of a replica's last KV-event batch when it arrived (router clock against the engine's timestamp).",
		"kvmesh_kv_events_connected":                "1 while the router is subscribed to a replica's KV events.",
		"kvmesh_kv_event_text_blocks_evicted_total": "Text blocks an engine's evictions removed from its replica's summary.",
		"kvmesh_kv_event_answers_total":             "Answers whose text blocks were related to engine blocks (outcome related) or could not be (unrelated).",
		"kvmesh_kv_event_rebases_total":             "Summaries rebuilt from the blocks an engine's events say it holds (the record of evicted blocks was full).",
	} {
		labels := []string{"replica"}
		if name == "kvmesh_kv_event_answers_total" {
			labels = append(labels, "outcome")
		}
		k.desc[name] = prometheus.NewDesc(name, help, labels, nil)
	}
	return k
}

// declared starts the replica's subscription when it has a publisher:
// given, or, with auto, found at its /kv_event_sources (asked in the
// background, again every 30 s until it answers).
func (k *kvEvents) declared(id string) {
	if !k.flag.on() {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.subs[id]; ok || k.ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(k.ctx)
	s := &kvSub{cancel: cancel}
	k.subs[id] = s
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		cfg, ok := k.flag.given[strings.TrimRight(id, "/")]
		for !ok && k.flag.auto {
			var err error
			if cfg, err = k.discover(ctx, id); err == nil {
				ok = true
				break
			}
			k.log.Debug("no KV-event publisher found yet", "replica", id, "error", err)
			t := time.NewTimer(30 * time.Second)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if !ok {
			return
		}
		tr := kvtrack.New(id, k.sums, kvtrack.Config{})
		sub, err := kvevents.New(cfg, tr)
		if err != nil {
			k.log.Warn("KV events off for the replica", "replica", id, "error", err)
			return
		}
		k.mu.Lock()
		s.sub, s.tr = sub, tr
		k.mu.Unlock()
		k.log.Info("subscribing to KV events", "replica", id, "endpoint", cfg.Endpoint, "replay", cfg.Replay)
		sub.Run(ctx)
	}()
}

// withdrawn stops the replica's subscription.
func (k *kvEvents) withdrawn(id string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if s, ok := k.subs[id]; ok {
		s.cancel()
		delete(k.subs, id)
	}
}

// close stops every subscription and waits for them.
func (k *kvEvents) close() {
	k.cancel()
	k.wg.Wait()
}

// answered hands an owned replica's answer to its tracker.
func (k *kvEvents) answered(id string, a proxy.Answered) {
	k.mu.Lock()
	var tr *kvtrack.Tracker
	if s := k.subs[id]; s != nil {
		tr = s.tr
	}
	k.mu.Unlock()
	if tr == nil {
		return
	}
	tr.Answered(kvtrack.Answer{Hashes: a.Hashes, PromptBytes: a.PromptBytes, TextBytes: a.TextBytes, BlockBytes: a.BlockBytes,
		PromptTokens: a.PromptTokens, CompletionTokens: a.CompletionTokens, CachedTokens: a.CachedTokens, Sent: a.Sent})
}

// discover reads a replica's KV-event publisher from GET
// /kv_event_sources, which vLLM serves (see parseSources).
func (k *kvEvents) discover(ctx context.Context, id string) (kvevents.Config, error) {
	var c kvevents.Config
	u, err := url.Parse(id)
	if err != nil {
		return c, err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, strings.TrimRight(id, "/")+"/kv_event_sources", nil)
	if err != nil {
		return c, err
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("GET /kv_event_sources: %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return c, err
	}
	return parseSources(body, u.Hostname())
}

// kvSource is one publisher as /kv_event_sources names it (vLLM's
// KVEventsConfig, or its discovery entry).
type kvSource struct {
	Enabled  *bool  `json:"enable_kv_cache_events"`
	Endpoint string `json:"endpoint"`
	Replay   string `json:"replay_endpoint"`
	Topic    string `json:"topic"`
}

// parseSources reads a /kv_event_sources body. vLLM 0.32 answers an
// object keyed by data-parallel rank, each value its KVEventsConfig
// ({"0": {"enable_kv_cache_events": true, "endpoint": "tcp://*:5557",
// "replay_endpoint": ..., "topic": ...}}; {} when events are off); later
// releases a JSON array of {data_parallel_rank, endpoint,
// replay_endpoint, topic}. One bare source object is read too. A replica
// is one stream to the tracker, so an engine with several data-parallel
// ranks (several publishers, each its own sequence and blocks) is
// refused: give --kv-events per replica for it. An endpoint vLLM binds on
// a wildcard ("tcp://*:PORT") is reached at the replica's host.
func parseSources(body []byte, host string) (kvevents.Config, error) {
	var c kvevents.Config
	var list []kvSource
	if err := json.Unmarshal(body, &list); err != nil {
		var byRank map[string]json.RawMessage
		if err := json.Unmarshal(body, &byRank); err != nil {
			return c, fmt.Errorf("/kv_event_sources: want a JSON object or array of sources: %w", err)
		}
		var one kvSource
		if _, ok := byRank["endpoint"]; ok {
			if err := json.Unmarshal(body, &one); err != nil {
				return c, fmt.Errorf("/kv_event_sources: %w", err)
			}
			list = append(list, one)
		} else {
			for rank, v := range byRank {
				var src kvSource
				if err := json.Unmarshal(v, &src); err != nil {
					return c, fmt.Errorf("/kv_event_sources: rank %q: %w", rank, err)
				}
				list = append(list, src)
			}
		}
	}
	on := list[:0]
	for _, src := range list {
		if src.Enabled == nil || *src.Enabled {
			on = append(on, src)
		}
	}
	list = on
	switch {
	case len(list) == 0:
		return c, fmt.Errorf("/kv_event_sources lists no publisher (KV-cache events off)")
	case len(list) > 1:
		return c, fmt.Errorf("/kv_event_sources lists %d publishers (data-parallel ranks); the router follows one per replica", len(list))
	}
	s := list[0]
	if s.Endpoint == "" {
		return c, fmt.Errorf("/kv_event_sources names no endpoint")
	}
	fix := func(ep string) string {
		rest, ok := strings.CutPrefix(ep, "tcp://")
		if !ok {
			return ep
		}
		h, port, found := strings.Cut(rest, ":")
		if !found || h == "*" || h == "" || h == "0.0.0.0" || h == "::" {
			return "tcp://" + hostJoin(host, port)
		}
		return ep
	}
	c = kvevents.Config{Endpoint: fix(s.Endpoint), Topic: s.Topic}
	if s.Replay != "" {
		c.Replay = fix(s.Replay)
	}
	if _, err := kvevents.New(c, nil); err != nil {
		return c, err
	}
	return c, nil
}

func hostJoin(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// Describe and Collect make kvEvents a prometheus.Collector of every
// subscription's counters.
func (k *kvEvents) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range k.desc {
		ch <- d
	}
}

func (k *kvEvents) Collect(ch chan<- prometheus.Metric) {
	for id, s := range k.snapshot() {
		st, ts := s.sub.Stats(), s.tr.Stats()
		c := func(name string, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(k.desc[name], prometheus.CounterValue, v, append([]string{id}, extra...)...)
		}
		g := func(name string, v float64) {
			ch <- prometheus.MustNewConstMetric(k.desc[name], prometheus.GaugeValue, v, id)
		}
		c("kvmesh_kv_events_total", float64(st.Events))
		c("kvmesh_kv_event_batches_total", float64(st.Batches))
		c("kvmesh_kv_event_gaps_total", float64(st.Gaps))
		c("kvmesh_kv_event_replayed_total", float64(st.Replayed))
		c("kvmesh_kv_event_resyncs_total", float64(st.Resyncs))
		c("kvmesh_kv_event_reconnects_total", float64(st.Reconnects))
		g("kvmesh_kv_event_lag_seconds", st.LagSeconds)
		conn := 0.0
		if st.Connected {
			conn = 1
		}
		g("kvmesh_kv_events_connected", conn)
		c("kvmesh_kv_event_text_blocks_evicted_total", float64(ts.Evicted))
		c("kvmesh_kv_event_answers_total", float64(ts.Attributed), "related")
		c("kvmesh_kv_event_answers_total", float64(ts.Unattributed), "unrelated")
		c("kvmesh_kv_event_rebases_total", float64(ts.Rebases))
	}
}

// snapshot lists the running subscriptions.
func (k *kvEvents) snapshot() map[string]*kvSub {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]*kvSub, len(k.subs))
	for id, s := range k.subs {
		if s.sub != nil {
			out[id] = s
		}
	}
	return out
}

// kvEventsDebug is one replica's subscription in /debug/mesh.
type kvEventsDebug struct {
	Events  kvevents.Stats `json:"events"`
	Tracker kvtrack.Stats  `json:"tracker"`
}

// debug lists every subscription for /debug/mesh.
func (k *kvEvents) debug() map[string]kvEventsDebug {
	out := map[string]kvEventsDebug{}
	for id, s := range k.snapshot() {
		out[id] = kvEventsDebug{Events: s.sub.Stats(), Tracker: s.tr.Stats()}
	}
	return out
}

// debug is /debug/mesh: the mesh's view, and the KV-event subscriptions
// when there are any.
func (r *router) debug() any {
	d := r.mesh.Debug()
	kv := r.kv.debug()
	if len(kv) == 0 {
		return d
	}
	return struct {
		mesh.DebugInfo
		KVEvents map[string]kvEventsDebug `json:"kv_events"`
	}{d, kv}
}
