package replicasim

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// LoRA adapters, as vLLM serves them with --enable-lora: the adapters a
// replica knows (Config.LoRAAdapters, vLLM's --lora-modules) are listed
// in /v1/models with the base model as their parent, and a request names
// one as its model. At most Config.MaxLoRAs adapters are resident at once
// (vLLM's --max-loras, GPU slots); a request for one that is not resident
// loads it (Config.LoRALoadMs), evicting the least recently used resident
// adapter no running sequence uses, and a request whose adapter cannot
// run (every resident slot in use by running sequences of other
// adapters) waits while later requests that can run go first, as vLLM's
// scheduler skips it. The adapter scopes the prefix cache: vLLM's block
// hashes include the adapter's id, so one prompt under two adapters (or
// an adapter and the base model) shares no block.
//
// vllm:lora_requests_info is published as vLLM's PrometheusStatLogger
// does: labels max_lora, running_lora_adapters and waiting_lora_adapters
// (comma-joined names), the series of the present label values set to
// the current Unix time, earlier series kept (a router reads which
// adapters are loaded from that history: internal/engine).
//
// How it differs from vLLM: a load delays only the requests of the
// adapter being loaded (vLLM loads it in the step that first schedules
// it, stalling that step for every running sequence), and always takes
// LoRALoadMs (vLLM reads an adapter from its CPU cache, --max-cpu-loras,
// much faster than from disk); the lists name adapters sorted (vLLM: in
// the order they became active); the gauge is set on every change of the
// lists rather than once per engine step, and keeps at most
// maxLoRASeries series (vLLM keeps every label set it ever recorded; an
// adapter named only in dropped series reads as not loaded); there is no /v1/load_lora_adapter, adapters are fixed at start.

// maxLoRASeries bounds the series of vllm:lora_requests_info kept: the
// oldest is dropped past it.
const maxLoRASeries = 64

// loraState is a replica's adapters: which it knows, which are resident
// (least recently used first), how many sequences of each run and wait.
// Its methods run under the scheduler's lock; a nil *loraState (no
// adapters) does nothing and fits every request.
type loraState struct {
	max      int
	known    map[string]bool
	load     time.Duration
	resident []residentAdapter // least recently used first
	running  map[string]int
	waiting  map[string]int
	loads    prometheus.Counter
	info     *prometheus.GaugeVec
	series   []string // the info series' label values, oldest first, joined by "\x00"
	shown    string   // the present series
	now      func() time.Time
}

type residentAdapter struct {
	name  string
	ready time.Time // when its load ends
}

func newLoRAState(cfg Config, load time.Duration, loads prometheus.Counter, info *prometheus.GaugeVec) *loraState {
	if len(cfg.LoRAAdapters) == 0 {
		return nil
	}
	l := &loraState{max: cfg.MaxLoRAs, known: map[string]bool{}, load: load, running: map[string]int{},
		waiting: map[string]int{}, loads: loads, info: info, now: time.Now}
	for _, a := range cfg.LoRAAdapters {
		l.known[a] = true
	}
	l.changed()
	return l
}

// knows reports whether model is an adapter this replica serves.
func (l *loraState) knows(model string) bool { return l != nil && l.known[model] }

func (l *loraState) waitChange(adapter string, d int) {
	if l == nil || adapter == "" {
		return
	}
	l.waiting[adapter] += d
	if l.waiting[adapter] <= 0 {
		delete(l.waiting, adapter)
	}
}

// fits reports whether a request of adapter can run now: its adapter
// runs already, or fewer than max adapters do.
func (l *loraState) fits(adapter string) bool {
	return l == nil || adapter == "" || l.running[adapter] > 0 || len(l.running) < l.max
}

// start counts a sequence of adapter as running and makes the adapter
// resident, loading it (evicting the least recently used idle one when
// every slot is taken) when it is not; it returns when the adapter is
// loaded. fits(adapter) held.
func (l *loraState) start(adapter string) time.Time {
	if l == nil || adapter == "" {
		return time.Time{}
	}
	l.running[adapter]++
	i := slices.IndexFunc(l.resident, func(r residentAdapter) bool { return r.name == adapter })
	if i >= 0 {
		r := l.resident[i]
		l.resident = append(slices.Delete(l.resident, i, i+1), r) // most recently used
		return r.ready
	}
	if len(l.resident) >= l.max {
		// fits held, so fewer than max adapters run: one resident is idle.
		if j := slices.IndexFunc(l.resident, func(r residentAdapter) bool { return l.running[r.name] == 0 }); j >= 0 {
			l.resident = slices.Delete(l.resident, j, j+1)
		}
	}
	r := residentAdapter{name: adapter, ready: l.now().Add(l.load)}
	l.resident = append(l.resident, r)
	l.loads.Inc()
	return r.ready
}

func (l *loraState) finish(adapter string) {
	if l == nil || adapter == "" {
		return
	}
	l.running[adapter]--
	if l.running[adapter] <= 0 {
		delete(l.running, adapter)
	}
}

// isResident reports whether adapter is loaded.
func (l *loraState) isResident(adapter string) bool {
	return l != nil && slices.ContainsFunc(l.resident, func(r residentAdapter) bool { return r.name == adapter })
}

// changed sets vllm:lora_requests_info's series of the present lists to
// the current time when the lists changed.
func (l *loraState) changed() {
	if l == nil {
		return
	}
	key := strconv.Itoa(l.max) + "\x00" + joinSorted(l.running) + "\x00" + joinSorted(l.waiting)
	if key == l.shown {
		return
	}
	l.shown = key
	labels := strings.Split(key, "\x00")
	l.info.WithLabelValues(labels...).Set(float64(l.now().UnixNano()) / 1e9)
	if i := slices.Index(l.series, key); i >= 0 {
		l.series = slices.Delete(l.series, i, i+1)
	}
	l.series = append(l.series, key)
	if len(l.series) > maxLoRASeries {
		l.info.DeleteLabelValues(strings.Split(l.series[0], "\x00")...)
		l.series = l.series[1:]
	}
}

// joinSorted is the names of m, sorted and comma-joined.
func joinSorted(m map[string]int) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

// Resident reports whether adapter is loaded (resident) at this replica.
// It is the simulator's own truth, which a test compares with where a
// router sent the adapter's requests; vLLM tells it nowhere.
func (s *Server) Resident(adapter string) bool {
	s.sched.mu.Lock()
	defer s.sched.mu.Unlock()
	return s.sched.loras.isResident(adapter)
}

// FreeSlots is how many more sequences could run at once right now.
func (s *Server) FreeSlots() int {
	s.sched.mu.Lock()
	defer s.sched.mu.Unlock()
	return max(s.sched.max-s.sched.running, 0)
}
