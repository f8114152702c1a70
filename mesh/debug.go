package mesh

import (
	"sort"
	"time"

	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
)

// Members lists the routers this router knows, sorted by name.
func (m *Mesh) Members() []MemberInfo { return m.mem.list() }

// ReplicaDebug describes one replica as this router sees it.
type ReplicaDebug struct {
	ID         string   `json:"id"`
	Owner      string   `json:"owner"`
	Owned      bool     `json:"owned"`
	DeclaredBy []string `json:"declared_by"`
	Models     []string `json:"models"`
	Healthy    bool     `json:"healthy"`
	Counts     bool     `json:"summary_counts"`
	Epoch      uint64   `json:"summary_epoch"`
	Version    uint64   `json:"summary_version"`
	OwnerVer   uint64   `json:"owner_version"`
	AgeSeconds float64  `json:"summary_age_seconds"`
	Bytes      int      `json:"summary_bytes"`
	// Held is the blocks the summary remembers (summary.Summary.Held).
	Held        int     `json:"summary_held_blocks"`
	InFlight    int     `json:"in_flight"`
	PendingPref float64 `json:"pending_prefill_blocks"`
	// The engine's own load: from this router's health checks for an
	// owned replica, as its owner gossips it for another's. Slots 0 is
	// unknown; running and waiting count only with EngineHasLoad (the
	// engine publishes them).
	EngineRunning int  `json:"engine_running"`
	EngineWaiting int  `json:"engine_waiting"`
	EngineSlots   int  `json:"engine_slots"`
	EngineHasLoad bool `json:"engine_has_load"`
	// The engine's LoRA adapters: its limit (0: unknown or no LoRA),
	// how many it had in use when it last ran any, and those of its
	// models that ran then (loaded) and waited, by name (the mesh carries
	// them as ids, named here from the replica's models).
	LoRAMax     int      `json:"lora_max,omitempty"`
	LoRAActive  int      `json:"lora_active,omitempty"`
	LoRALoaded  []string `json:"lora_loaded,omitempty"`
	LoRAWaiting []string `json:"lora_waiting,omitempty"`
	// Role is the replica's part of disaggregated requests (both,
	// prefill or decode) and BootstrapPort a prefill replica's KV
	// bootstrap port (0: unknown), as declared or discovered by its owner.
	Role          string `json:"role"`
	BootstrapPort int    `json:"bootstrap_port,omitempty"`
}

// DebugInfo is the mesh as this router sees it, what Debug returns: the
// status page reads it, and the admin handler serves it as JSON.
type DebugInfo struct {
	Name     string         `json:"name"`
	Members  []MemberInfo   `json:"members"`
	Replicas []ReplicaDebug `json:"replicas"`
	Queued   int            `json:"queued_batches"`
}

// Debug returns members and replicas as this router sees them.
func (m *Mesh) Debug() DebugInfo {
	info := DebugInfo{Name: m.cfg.Name, Members: m.Members(), Queued: int(m.dis.queued.Load())}
	now := time.Now()
	m.tab.mu.RLock()
	for _, r := range m.tab.replicas {
		d := ReplicaDebug{ID: r.id, Owner: m.tab.ownerLocked(r), Owned: r.owned, DeclaredBy: m.tab.declarersLocked(r, now)}
		if r.owned {
			d.Models, d.Healthy, d.Counts = r.models, r.healthy, r.sum != nil
			d.InFlight, d.PendingPref = int(r.load.inFlight.Load()), float64(r.load.pendingK.Load())/1000
			d.setEngine(r.engine)
			d.setLoRA(r.lora)
			d.Role, d.BootstrapPort = r.role.String(), int(r.bootstrap)
		} else if r.hasState && r.st.Origin == d.Owner {
			d.Models, d.Healthy, d.Counts = r.st.Models, r.st.Healthy, m.tab.countsLocked(r, now)
			f, p, _ := r.remoteLoad()
			d.InFlight, d.PendingPref, d.OwnerVer = int(f), p, r.st.Version
			d.AgeSeconds = now.Sub(r.heard).Seconds()
			d.setEngine(r.st.Engine)
			d.setLoRA(r.st.LoRA)
			d.Role, d.BootstrapPort = r.st.Role.String(), int(r.st.Bootstrap)
		}
		if r.sum != nil {
			s := r.sum.Stats()
			d.Epoch, d.Version, d.Bytes, d.Held = s.Epoch, s.Version, s.Bytes, r.sum.Held()
		}
		info.Replicas = append(info.Replicas, d)
	}
	m.tab.mu.RUnlock()
	sort.Slice(info.Replicas, func(i, j int) bool { return info.Replicas[i].ID < info.Replicas[j].ID })
	return info
}

// MatchReplica is the prefix match of probes on one replica as this
// router sees it, or -1 when it has no summary of the replica that counts
// (tests and the scale harness measure visibility with it).
func (m *Mesh) MatchReplica(id string, probes []summary.Probe) int {
	now := time.Now()
	m.tab.mu.RLock()
	defer m.tab.mu.RUnlock()
	r := m.tab.replicas[id]
	switch {
	case r == nil || r.sum == nil:
		return -1
	case r.owner == m.cfg.Name, m.tab.countsLocked(r, now) && r.st.Origin == r.owner:
		return r.sum.Match(probes)
	}
	return -1
}

// setEngine fills d's engine fields from l.
func (d *ReplicaDebug) setEngine(l route.EngineLoad) {
	d.EngineRunning, d.EngineWaiting, d.EngineSlots, d.EngineHasLoad = int(l.Running), int(l.Waiting), int(l.Slots), l.HasLoad
}

// setLoRA fills d's LoRA fields from a, naming its adapters from
// d.Models.
func (d *ReplicaDebug) setLoRA(a route.LoRAs) {
	d.LoRAMax, d.LoRAActive = int(a.Max), int(a.Active)
	d.LoRALoaded, d.LoRAWaiting = a.Named(d.Models)
}
