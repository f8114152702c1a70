package status

import (
	"fmt"
	"sort"

	dto "github.com/prometheus/client_model/go"
)

// kvEventRow is one replica's KV-event subscription (router --kv-events):
// whether it is connected, what came, what was lost and how late.
type kvEventRow struct {
	ID, Connected, Class                     string
	Events, Gaps, Replayed, Resyncs, Evicted string
	Lag                                      string
}

// addKVEvents fills the KV-event rows from the kvmesh_kv_event* series;
// none when the router subscribes to no engine.
func (v *view) addKVEvents(fams []*dto.MetricFamily) {
	conn := family(fams, "kvmesh_kv_events_connected")
	if conn == nil {
		return
	}
	byReplica := func(name string) map[string]float64 {
		out := map[string]float64{}
		if f := family(fams, name); f != nil {
			for _, m := range f.GetMetric() {
				out[label(m, "replica")] += value(m)
			}
		}
		return out
	}
	events, gaps, replayed := byReplica("kvmesh_kv_events_total"), byReplica("kvmesh_kv_event_gaps_total"), byReplica("kvmesh_kv_event_replayed_total")
	resyncs, lag, evicted := byReplica("kvmesh_kv_event_resyncs_total"), byReplica("kvmesh_kv_event_lag_seconds"), byReplica("kvmesh_kv_event_text_blocks_evicted_total")
	for _, m := range conn.GetMetric() {
		id := label(m, "replica")
		r := kvEventRow{ID: id, Connected: "connected", Class: "up", Events: humanCount(events[id]), Gaps: humanCount(gaps[id]),
			Replayed: humanCount(replayed[id]), Resyncs: humanCount(resyncs[id]), Evicted: humanCount(evicted[id]),
			Lag: fmt.Sprintf("%.0f ms", 1000*lag[id])}
		if value(m) == 0 {
			r.Connected, r.Class = "reconnecting", "down"
		} else if resyncs[id] > 0 {
			r.Class = "warn"
		}
		v.KVEvents = append(v.KVEvents, r)
	}
	sort.Slice(v.KVEvents, func(i, j int) bool { return v.KVEvents[i].ID < v.KVEvents[j].ID })
}
