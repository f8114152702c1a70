package health

import (
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// loraGauges are the LoRA series of the replicas a checker checks: each
// engine's limit and the adapters its running and waiting requests name
// (at most route.MaxLoRAEntries per replica, as the mesh gossips them).
type loraGauges struct {
	max, adapters *prometheus.GaugeVec
}

func newLoRAGauges(f promauto.Factory) loraGauges {
	return loraGauges{
		max: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_replica_lora_max",
			Help: "LoRA adapters each replica's engine holds resident at once (vLLM's max_lora); absent without LoRA.",
		}, []string{"replica"}),
		adapters: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_replica_lora_adapters",
			Help: "LoRA adapters in use at each replica's engine (value 1), by state: loaded (its requests ran when the engine last ran any adapter) or waiting, as its metrics last said.",
		}, []string{"replica", "adapter", "state"}),
	}
}

// show sets replica id's series to st's adapters when they differ from
// shown (what they show now), and records them there.
func (g loraGauges) show(id string, st ReplicaStatus, shown *route.LoRAs) {
	if st.LoRA == *shown {
		return
	}
	*shown = st.LoRA
	g.forget(id)
	if !st.LoRA.Known() {
		return
	}
	if st.LoRA.Max > 0 {
		g.max.WithLabelValues(id).Set(float64(st.LoRA.Max))
	}
	running, waiting := st.LoRA.Named(st.Models)
	for _, a := range running {
		g.adapters.WithLabelValues(id, a, "loaded").Set(1)
	}
	for _, a := range waiting {
		g.adapters.WithLabelValues(id, a, "waiting").Set(1)
	}
}

// forget drops replica id's series.
func (g loraGauges) forget(id string) {
	g.max.DeleteLabelValues(id)
	g.adapters.DeletePartialMatch(prometheus.Labels{"replica": id})
}
