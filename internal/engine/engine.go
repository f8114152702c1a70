// Package engine reads what a router needs to know about an inference
// engine (vLLM, SGLang, llama.cpp's server, TGI) from the engine's own
// endpoints and metric names: whether it is up, its load (running and
// waiting requests), its concurrency limit where it publishes one, and its
// KV cache capacity and block size.
//
// The package does no I/O: an Adapter names the paths to read and turns
// their bodies into Stats; the caller fetches them with its own client,
// timeouts and size limits. Every parser takes untrusted bytes and is
// fuzzed.
package engine

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/route"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Kind names an engine.
type Kind string

// The engines with adapters, and Generic for any other OpenAI-compatible
// server (health from /v1/models only, no load).
const (
	VLLM     Kind = "vllm"
	SGLang   Kind = "sglang"
	LlamaCpp Kind = "llamacpp"
	TGI      Kind = "tgi"
	Generic  Kind = "openai"
	// Auto is not an engine: it asks the caller to Detect the kind from
	// the replica's /metrics.
	Auto Kind = "auto"
)

// Kinds lists the engines with adapters, in the order Detect tries them.
var kinds = []Kind{SGLang, LlamaCpp, TGI, VLLM}

// SharesQueuedPrefill reports whether the engine queues the requests it
// accepts behind one another and lets each reuse the prompt blocks the
// ones before it computed (vLLM: one scheduler, one paged cache), or
// computes each request's prompt in a slot of its own, so requests sent
// together share nothing (llama.cpp: a slot keeps only its own prompt).
// known is false for the engines whose behaviour is not known here
// (SGLang, TGI, an unknown OpenAI server): a router then judges by the
// timing of each answer.
func (k Kind) SharesQueuedPrefill() (shares, known bool) {
	switch k {
	case VLLM:
		return true, true
	case LlamaCpp:
		return false, true
	}
	return false, false
}

// ParseKind parses an --engine value: auto or one of the engines.
func ParseKind(s string) (Kind, error) {
	k := Kind(strings.ToLower(strings.TrimSpace(s)))
	if k == Auto || k == Generic || slices.Contains(kinds, k) {
		return k, nil
	}
	return "", fmt.Errorf("engine %q is not auto, vllm, sglang, llamacpp, tgi or openai", s)
}

// Stats is what an engine tells about itself. Zero means unknown for
// every field (route.EngineLoad's rule).
type Stats struct {
	// EngineLoad is what the routing decision reads of the engine: the
	// adapter fills it and it travels as is to route.Candidate.
	route.EngineLoad
	// BlockSize is the engine's KV cache block (page) in tokens.
	BlockSize int
	// CacheTokens is the engine's KV cache capacity in tokens.
	CacheTokens int64
	// Role is the part of disaggregated requests the engine says it
	// serves (SGLang's disaggregation_mode); RoleBoth when it says
	// nothing.
	Role route.Role
	// Bootstrap is a prefill engine's KV bootstrap port (SGLang's
	// disaggregation_bootstrap_port); 0 when unknown.
	Bootstrap uint16
	// LoRA is what the engine tells of its LoRA adapters.
	LoRA LoRAInfo
}

// LoRAInfo is what an engine's metrics tell of its LoRA adapters (vLLM's
// vllm:lora_requests_info, read by Families.loraInfo): its limit on
// adapters resident at once, the adapters it holds loaded, and those its
// running and waiting requests name now, as comma-separated lists (the
// form the engine labels them with). The zero value tells nothing (an
// engine without LoRA).
type LoRAInfo struct {
	// Max is the engine's limit (vLLM's --max-loras); 0 is unknown.
	Max int
	// Loaded are the adapters the engine holds, most recently used
	// first; Running and Waiting those of its running and waiting
	// requests now. Each at most maxLoRAList bytes.
	Loaded, Running, Waiting string
}

// maxLoRAList bounds a list of adapter names an engine reports (its
// label value): 64 names of 128 bytes.
const maxLoRAList = 8 << 10

// names splits a comma-separated list of adapter names.
func names(list string) []string {
	if list == "" {
		return nil
	}
	var out []string
	for n := range strings.SplitSeq(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// LoRAsOf is a replica's LoRA adapters as the decision reads them
// (route.LoRAs), from what its metrics tell (info) and its model list
// (models: which of its models are base models). A replica whose engine
// reports no LoRA limit, runs no adapter and lists none has none.
func LoRAsOf(info LoRAInfo, models ModelList) route.LoRAs {
	if info == (LoRAInfo{}) && len(models.Adapters) == 0 {
		return route.LoRAs{}
	}
	return route.MakeLoRAs(info.Max, models.Bases(), names(info.Loaded), names(info.Running), names(info.Waiting))
}

// Merge returns s with its unknown fields taken from o.
func (s Stats) Merge(o Stats) Stats {
	s.EngineLoad = s.EngineLoad.Merge(o.EngineLoad)
	if s.BlockSize == 0 {
		s.BlockSize = o.BlockSize
	}
	if s.CacheTokens == 0 {
		s.CacheTokens = o.CacheTokens
	}
	if s.Role == route.RoleBoth {
		s.Role = o.Role
	}
	if s.Bootstrap == 0 {
		s.Bootstrap = o.Bootstrap
	}
	if s.LoRA == (LoRAInfo{}) {
		s.LoRA = o.LoRA
	}
	return s
}

// Forget returns s as known once the engine's /metrics stops answering:
// what the engine is configured with stays, its gauges become unknown
// (route.EngineLoad.Forget), and of its LoRA adapters the limit stays
// (which are loaded becomes unknown too: the engine may have restarted).
func (s Stats) Forget() Stats {
	s.EngineLoad = s.EngineLoad.Forget()
	s.LoRA = LoRAInfo{Max: s.LoRA.Max}
	return s
}

// ReplicaStatus is what a router's health checks know of one replica:
// the health checker reports it and the mesh gossips it, one type from
// one end to the other.
type ReplicaStatus struct {
	// Models the replica serves, sorted.
	Models []string
	// Healthy: the replica passes its checks.
	Healthy bool
	// CapacityBlocks is the engine's KV cache in router blocks (0:
	// unknown, the mesh assumes its default).
	CapacityBlocks int
	// Load is the engine's own load at the last scrape. Its Slots is
	// published by the engine, else learned by the health checker. When
	// the engine publishes no running and waiting counts (an
	// OpenAI-compatible server, an engine without them on its /metrics)
	// or its last scrape failed, HasLoad is false: 0 and 0 then say
	// nothing, and must not read as an idle engine.
	Load route.EngineLoad
	// Engine is the adapter reading the replica (vllm, sglang, llamacpp,
	// tgi, or openai for an unknown OpenAI-compatible server); the mesh
	// does not read it.
	Engine string
	// Restarts counts the engine's restarts the health checker found
	// (proxy/health's restart.go); when it grows, the owner cuts the
	// replica's summary (mesh's restartedLocked).
	Restarts int
	// Role is the part of a request the replica serves when prefill and
	// decode are disaggregated: declared with the replica (the router's
	// --replica URL#prefill) or read from the engine (SGLang's
	// disaggregation_mode); RoleBoth, a whole replica, when neither says.
	// The owner gossips it (the mesh's flagRole).
	Role route.Role
	// Bootstrap is a prefill replica's KV bootstrap port, which the
	// legs of an SGLang-style disaggregated request name (0: unknown).
	Bootstrap uint16
	// LoRA is the engine's LoRA adapters (LoRAsOf): its limit, the
	// adapters in use, which models are base models. The mesh gossips it
	// beside Load and the view reduces it per model to
	// route.Candidate.LoRA.
	LoRA route.LoRAs
}

// Equal reports that s and o report the same.
func (s ReplicaStatus) Equal(o ReplicaStatus) bool {
	return s.Healthy == o.Healthy && slices.Equal(s.Models, o.Models) && s.CapacityBlocks == o.CapacityBlocks &&
		s.Load == o.Load && s.Engine == o.Engine && s.Restarts == o.Restarts && s.LoRA == o.LoRA &&
		s.Role == o.Role && s.Bootstrap == o.Bootstrap
}

// Adapter reads one kind of engine.
type Adapter interface {
	// Kind names the engine.
	Kind() Kind
	// HealthPath is the GET path that answers 200 when the engine can
	// serve ("" when only /v1/models tells).
	HealthPath() string
	// InfoPath is a GET path with JSON facts the metrics lack, such as
	// the slot count ("" when none).
	InfoPath() string
	// FromMetrics reads load and cache facts from parsed /metrics.
	FromMetrics(Families) Stats
	// FromInfo reads the body of InfoPath.
	FromInfo(body []byte) (Stats, error)
}

// For returns the adapter of kind k (not Auto).
func For(k Kind) (Adapter, error) {
	switch k {
	case VLLM:
		return vllm{}, nil
	case SGLang:
		return sglang{}, nil
	case LlamaCpp:
		return llamacpp{}, nil
	case TGI:
		return tgi{}, nil
	case Generic:
		return generic{}, nil
	}
	return nil, fmt.Errorf("no adapter for engine %q", k)
}

// Families are the metric families of one /metrics page, by name.
type Families map[string]*dto.MetricFamily

// ParseMetrics parses a Prometheus text exposition (what every supported
// engine serves on /metrics). On a malformed page it returns the families
// read before the error together with the error, so one odd line late in a
// page does not hide the load gauges before it.
func ParseMetrics(b []byte) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return Families(fams), fmt.Errorf("parse metrics: %w", err)
	}
	return Families(fams), nil
}

// Detect names the engine that wrote fams, from the metric names only it
// uses; ok is false when none matches.
func Detect(fams Families) (k Kind, ok bool) {
	markers := map[Kind][]string{
		SGLang:   {"sglang:num_running_reqs", "sglang:num_queue_reqs"},
		LlamaCpp: {"llamacpp:requests_processing", "llamacpp:requests_deferred"},
		TGI:      {"tgi_queue_size", "tgi_batch_current_size"},
		VLLM:     {"vllm:num_requests_running", "vllm:num_requests_waiting"},
	}
	for _, k := range kinds {
		for _, name := range markers[k] {
			if fams[name] != nil {
				return k, true
			}
		}
	}
	// A page without the load gauges (an engine still starting) may still
	// carry the engine's prefix.
	for _, k := range kinds {
		prefix := string(k) + ":"
		if k == TGI {
			prefix = "tgi_"
		}
		for name := range fams {
			if strings.HasPrefix(name, prefix) {
				return k, true
			}
		}
	}
	return "", false
}

// modelsResponse is the OpenAI GET /v1/models response, as far as read:
// vLLM lists a LoRA adapter with its base model as "parent" (null for a
// base model).
type modelsResponse struct {
	Data []struct {
		ID     string  `json:"id"`
		Parent *string `json:"parent"`
	} `json:"data"`
}

// ModelList is what an engine's GET /v1/models lists: every model it
// serves, and which of them are LoRA adapters.
type ModelList struct {
	// Models are the model IDs, sorted, without duplicates.
	Models []string
	// Adapters are the models listed with a parent (LoRA adapters on top
	// of a base model), sorted, without duplicates.
	Adapters []string
}

// Bases are the models that are not adapters.
func (l ModelList) Bases() []string {
	var out []string
	for _, m := range l.Models {
		if _, ok := slices.BinarySearch(l.Adapters, m); !ok {
			out = append(out, m)
		}
	}
	return out
}

// ParseModels reads an OpenAI GET /v1/models body (every supported
// engine serves one): the model IDs, and those listed with a parent.
func ParseModels(b []byte) (ModelList, error) {
	var l modelsResponse
	if err := json.Unmarshal(b, &l); err != nil {
		return ModelList{}, fmt.Errorf("parse models: %w", err)
	}
	var out ModelList
	out.Models = make([]string, 0, len(l.Data))
	for _, m := range l.Data {
		if m.ID == "" {
			continue
		}
		out.Models = append(out.Models, m.ID)
		if m.Parent != nil && *m.Parent != "" && *m.Parent != m.ID {
			out.Adapters = append(out.Adapters, m.ID)
		}
	}
	slices.Sort(out.Models)
	slices.Sort(out.Adapters)
	out.Models, out.Adapters = slices.Compact(out.Models), slices.Compact(out.Adapters)
	return out, nil
}

// Bounds on what an engine may claim; beyond them a value is junk.
const (
	maxCount       = 1 << 24 // requests or slots
	maxBlockSize   = 1 << 20 // tokens per block
	maxCacheTokens = 1 << 50
)

// value reads a sample of any scalar type.
func value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	return v, true
}

// sum adds the samples of family name over all its series (one per
// engine core or data-parallel rank); ok is false when it has none.
func (f Families) sum(name string) (float64, bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	total, ok := 0.0, false
	for _, m := range fam.GetMetric() {
		if v, vok := value(m); vok {
			total, ok = total+v, true
		}
	}
	return total, ok
}

// count reads a summed family as a request or slot count.
func (f Families) count(name string) (int, bool) {
	v, ok := f.sum(name)
	if !ok || v > maxCount {
		return 0, false
	}
	return int(math.Round(v)), true
}

// load reads the running and waiting gauges.
func (f Families) load(running, waiting string) Stats {
	var s Stats
	r, okR := f.count(running)
	w, okW := f.count(waiting)
	if okR || okW {
		s.Running, s.Waiting, s.HasLoad = route.Count32(r), route.Count32(w), true
	}
	return s
}

// loraInfo reads an info gauge of LoRA adapters (vLLM's
// vllm:lora_requests_info{max_lora, running_lora_adapters,
// waiting_lora_adapters}). vLLM sets the series of the lists it records
// to the current time at every record and keeps the series of earlier
// lists, so the page is a history: the latest series is the present
// (Running and Waiting), and an adapter was last used at the latest time
// of a series naming it running. vLLM keeps the adapters it used last
// loaded, evicting the least recently used one only to load another, so
// the Max most recently used are the ones it holds (Loaded): an idle
// engine's present names none, while they stay loaded. With no limit
// known, Loaded are those the latest series naming any adapter ran (what
// llm-d's metrics extractor reads as active). A list over maxLoRAList
// bytes is cut at its last name that fits.
func (f Families) loraInfo(name string) LoRAInfo {
	fam := f[name]
	if fam == nil {
		return LoRAInfo{}
	}
	type series struct {
		at                    float64
		max, running, waiting string
	}
	var latest, named *series
	lastRun := map[string]float64{}
	for _, m := range fam.GetMetric() {
		v, ok := value(m)
		if !ok {
			continue
		}
		s := &series{at: v}
		for _, p := range m.GetLabel() {
			switch p.GetName() {
			case "max_lora":
				s.max = p.GetValue()
			case "running_lora_adapters":
				s.running = cutList(p.GetValue())
			case "waiting_lora_adapters":
				s.waiting = cutList(p.GetValue())
			}
		}
		if latest == nil || v >= latest.at {
			latest = s
		}
		if s.running != "" && (named == nil || v >= named.at) {
			named = s
		}
		for _, n := range names(s.running) {
			lastRun[n] = max(lastRun[n], v)
		}
	}
	if latest == nil {
		return LoRAInfo{}
	}
	info := LoRAInfo{Running: latest.running, Waiting: latest.waiting}
	if v, ok := parseCount(latest.max, 1<<16-1); ok {
		info.Max = int(v)
	}
	switch {
	case info.Max > 0:
		recent := make([]string, 0, len(lastRun))
		for n := range lastRun {
			recent = append(recent, n)
		}
		slices.SortFunc(recent, func(a, b string) int {
			if c := cmp.Compare(lastRun[b], lastRun[a]); c != 0 {
				return c
			}
			return strings.Compare(a, b)
		})
		info.Loaded = cutList(strings.Join(recent[:min(len(recent), info.Max)], ","))
	case named != nil:
		info.Loaded = named.running
	}
	return info
}

// cutList is list within maxLoRAList bytes, cut at a comma.
func cutList(list string) string {
	if len(list) <= maxLoRAList {
		return list
	}
	if i := strings.LastIndexByte(list[:maxLoRAList], ','); i > 0 {
		return list[:i]
	}
	return ""
}

// labels returns the label values of each series of family name.
func (f Families) labels(name string) []map[string]string {
	fam := f[name]
	if fam == nil {
		return nil
	}
	out := make([]map[string]string, 0, len(fam.GetMetric()))
	for _, m := range fam.GetMetric() {
		l := make(map[string]string, len(m.GetLabel()))
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		out = append(out, l)
	}
	return out
}

// infoCache reads an info gauge whose labels carry the block size and
// block count (vLLM's cache_config_info, SGLang's): the block size of
// its first good series, and the blocks of all good series (one per
// engine core) as tokens.
func (f Families) infoCache(name, sizeLabel, blocksLabel string) (blockSize int, tokens int64) {
	for _, l := range f.labels(name) {
		bs, ok1 := parseCount(l[sizeLabel], maxBlockSize)
		nb, ok2 := parseCount(l[blocksLabel], maxCacheTokens)
		if !ok1 || !ok2 || bs == 0 || nb == 0 {
			continue
		}
		if blockSize == 0 {
			blockSize = int(bs)
		}
		tokens = min(tokens+bs*nb, maxCacheTokens)
	}
	return blockSize, tokens
}

// parseCount parses a label value as a whole number in [0, limit]
// ("None" and the like are not).
func parseCount(s string, limit int64) (int64, bool) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || v < 0 || v > float64(limit) || v != math.Trunc(v) {
		return 0, false
	}
	return int64(v), true
}

// jsonCount reads a JSON number as a count in [0, limit]; null, absent
// and junk are not.
func jsonCount(v any, limit int64) (int64, bool) {
	f, ok := v.(float64)
	if !ok || math.IsNaN(f) || f < 0 || f > float64(limit) {
		return 0, false
	}
	return int64(f), true
}

// generic is any OpenAI-compatible server: /v1/models answers, nothing
// else is known.
type generic struct{}

func (generic) Kind() Kind                     { return Generic }
func (generic) HealthPath() string             { return "" }
func (generic) InfoPath() string               { return "" }
func (generic) FromMetrics(Families) Stats     { return Stats{} }
func (generic) FromInfo([]byte) (Stats, error) { return Stats{}, nil }
