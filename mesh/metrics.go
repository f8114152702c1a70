package mesh

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Drop reasons, the label of kvmesh_gossip_dropped_total.
const (
	dropHandoffFull = "handoff_full" // NotifyMsg's hand-off channel was full
	dropDecode      = "decode"       // bytes that did not decode
	dropDuplicate   = "duplicate"    // seen before (not an error; counted to see fan-in)
	dropRefused     = "refused"      // from a router we do not accept, or not the owner
	dropStateFull   = "state_full"   // a full summary left out of push/pull state for size
)

// Outcomes of a full copy received, the label of
// kvmesh_summary_full_copies_received_total.
const (
	fullInstalled = "installed" // replaced the copy (or was the first)
	fullEqual     = "equal"     // equal to the copy held, which is kept
)

type metrics struct {
	bytes    *prometheus.CounterVec
	messages *prometheus.CounterVec
	dropped  *prometheus.CounterVec
	resyncs  prometheus.Counter
	// fullCopies counts full copies sent to a peer, by reason.
	fullCopies *prometheus.CounterVec
	// deltaBytes and deltaEntries count delta payloads queued to peers and
	// the log entries (blocks) they carry: bytes per block per peer.
	deltaBytes, deltaEntries prometheus.Counter
	age                      *prometheus.GaugeVec
	refusals                 prometheus.Counter
	// cuts counts generation cuts of owned summaries, by what they
	// dropped (older, both).
	cuts *prometheus.CounterVec
	// fullsIn counts full copies received from owners, by what became
	// of them (installed, equal: the copy held the same summary).
	fullsIn *prometheus.CounterVec
	// beacons counts load beacons' entries by outcome (beacon.go).
	beacons *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, members, queue func() float64) *metrics {
	f := promauto.With(reg)
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_mesh_members", Help: "Alive routers in the mesh, this one included."}, members)
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_gossip_queue_depth", Help: "Batches waiting in this router's per-peer send queues."}, queue)
	m := &metrics{
		bytes: f.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_gossip_bytes_total",
			Help: "Bytes of kvmesh gossip (broadcasts, direct messages, push/pull state)."}, []string{"direction"}),
		messages: f.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_gossip_messages_total",
			Help: "kvmesh gossip messages by kind."}, []string{"kind", "direction"}),
		dropped: f.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_gossip_dropped_total",
			Help: "Gossip messages dropped, by reason."}, []string{"reason"}),
		resyncs: f.NewCounter(prometheus.CounterOpts{Name: "kvmesh_summary_resyncs_total",
			Help: "Full summary copies requested to repair a gap or divergence."}),
		deltaBytes: f.NewCounter(prometheus.CounterOpts{Name: "kvmesh_summary_delta_bytes_total",
			Help: "Bytes of summary deltas queued to peers (each peer counted)."}),
		deltaEntries: f.NewCounter(prometheus.CounterOpts{Name: "kvmesh_summary_delta_entries_total",
			Help: "Summary log entries (added or forgotten blocks, rotations) carried by deltas queued to peers."}),
		fullCopies: f.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_summary_full_copies_total",
			Help: "Full summary copies sent to peers, by reason (overflow, send_error, request, cheaper, log, new_peer)."}, []string{"reason"}),
		age: f.NewGaugeVec(prometheus.GaugeOpts{Name: "kvmesh_summary_age_seconds",
			Help: "Seconds since the last state or delta from a replica's owner."}, []string{"replica"}),
		refusals: f.NewCounter(prometheus.CounterOpts{Name: "kvmesh_mesh_contract_refusals_total",
			Help: "Peers refused because their hashing contract or metadata differs."}),
		cuts: f.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_summary_cuts_total",
			Help: "Generation cuts of owned summaries after engine misses (older), engine restarts (both) or rebases on what an engine's KV events say it holds (rebase), by the generations dropped."}, []string{"dropped"}),
		fullsIn: f.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_summary_full_copies_received_total",
			Help: "Full summary copies received from owners, by outcome (installed; equal: the copy held the same summary, kept)."}, []string{"outcome"}),
		beacons: f.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_load_beacon_entries_total",
			Help: "Replica loads in load beacons, by outcome: sent (once per beacon, whatever the peers), deferred (left to a later beacon by the packet bound), applied, old (not newer than the copy's), ignored (unknown replica, another owner or boot)."}, []string{"outcome"}),
	}
	for _, o := range []string{beaconSent, beaconDeferred, beaconApplied, beaconOld, beaconIgnored} {
		m.beacons.WithLabelValues(o)
	}
	for _, o := range []string{fullInstalled, fullEqual} {
		m.fullsIn.WithLabelValues(o)
	}
	for _, d := range []string{"in", "out"} {
		m.bytes.WithLabelValues(d)
	}
	for _, r := range []string{fullOverflow, fullSendError, fullRequest, fullCheaper, fullLog, fullNewPeer} {
		m.fullCopies.WithLabelValues(r)
	}
	for _, r := range []string{dropHandoffFull, dropDecode, dropDuplicate, dropRefused, dropStateFull} {
		m.dropped.WithLabelValues(r)
	}
	return m
}

func kindName(k byte) string {
	switch k {
	case kindState:
		return "state"
	case kindBatch:
		return "batch"
	case kindFullReq:
		return "full_request"
	case kindPushPull:
		return "push_pull"
	case kindUsage:
		return "usage"
	case kindLoad:
		return "load"
	}
	return "unknown"
}

func (m *metrics) in(kind byte, n int) {
	m.bytes.WithLabelValues("in").Add(float64(n))
	m.messages.WithLabelValues(kindName(kind), "in").Inc()
}

func (m *metrics) out(kind byte, n int) {
	m.bytes.WithLabelValues("out").Add(float64(n))
	m.messages.WithLabelValues(kindName(kind), "out").Inc()
}
