package replicasim

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/internal/kvevents"
)

// KVEventSink publishes the simulated engine's KV-cache events
// (*kvevents.Publisher does, in vLLM's format).
type KVEventSink interface {
	Publish(b kvevents.Batch) error
}

// PublishKVEvents makes the replica publish its KV-cache events to sink,
// as vLLM does with --kv-events-config: BlockStored for each run of blocks
// it caches (chained by parent), BlockRemoved for each eviction,
// AllBlocksCleared on /reset_prefix_cache. GET /kv_event_sources then
// lists the publisher as vLLM 0.32 does (its KVEventsConfig by
// data-parallel rank), as a router's --kv-events auto reads it. Call it
// before serving requests.
func (s *Server) PublishKVEvents(sink KVEventSink, endpoint, replay, topic string) {
	s.cache.mu.Lock()
	s.cache.publish = func(evs []kvevents.Event) {
		if err := sink.Publish(kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs}); err != nil {
			s.logger.Warn("publishing KV events", "error", err)
		}
	}
	s.cache.mu.Unlock()
	src, _ := json.Marshal(map[string]any{"0": map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
		"endpoint": endpoint, "replay_endpoint": replay, "topic": topic}})
	s.sources.Store(&src)
}

// serveKVEventSources answers GET /kv_event_sources ({} while the
// replica publishes none, as vLLM answers).
func (s *Server) serveKVEventSources(w http.ResponseWriter, _ *http.Request) {
	src := s.sources.Load()
	w.Header().Set("Content-Type", "application/json")
	if src == nil {
		_, _ = w.Write([]byte("{}"))
		return
	}
	_, _ = w.Write(*src)
}
