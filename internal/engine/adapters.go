package engine

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/route"
)

// vllm reads vLLM's OpenAI server: GET /health; vllm:num_requests_running
// and vllm:num_requests_waiting (one series per engine core, summed);
// the cache from the labels of vllm:cache_config_info (block_size ×
// num_gpu_blocks, or kv_cache_size_tokens where newer versions add it).
// vLLM publishes no max_num_seqs: the caller learns the slot count. The
// KV cache in use is vllm:kv_cache_usage_perc (a share, not a percent),
// vllm:gpu_cache_usage_perc before 0.10. With --enable-lora, its LoRA
// limit and the adapters in use are the labels of the latest series of
// vllm:lora_requests_info (Families.loraInfo).
type vllm struct{}

func (vllm) Kind() Kind         { return VLLM }
func (vllm) HealthPath() string { return "/health" }
func (vllm) InfoPath() string   { return "" }

func (vllm) FromMetrics(f Families) Stats {
	s := f.load("vllm:num_requests_running", "vllm:num_requests_waiting")
	s.KVUsage = f.kvUsage("vllm:kv_cache_usage_perc")
	if s.KVUsage == 0 {
		s.KVUsage = f.kvUsage("vllm:gpu_cache_usage_perc")
	}
	s.BlockSize, s.CacheTokens = f.infoCache("vllm:cache_config_info", "block_size", "num_gpu_blocks")
	if s.CacheTokens == 0 {
		var total int64
		for _, l := range f.labels("vllm:cache_config_info") {
			if t, ok := parseCount(l["kv_cache_size_tokens"], maxCacheTokens); ok {
				total = min(total+t, maxCacheTokens)
			}
		}
		s.CacheTokens = total
	}
	s.LoRA = f.loraInfo("vllm:lora_requests_info")
	return s
}

func (vllm) FromInfo([]byte) (Stats, error) { return Stats{}, nil }

// sglang reads SGLang's server (started with --enable-metrics): GET
// /health; sglang:num_running_reqs and sglang:num_queue_reqs (one series
// per data-parallel rank, summed); the cache from sglang:cache_config_info
// {page_size, num_pages}, the sglang:page_size/sglang:num_pages gauges of
// later versions, or sglang:max_total_num_tokens; and from GET
// /get_server_info its max_running_requests (the slot count),
// max_total_num_tokens and page_size, and its disaggregation_mode
// (prefill, decode, or "null" for a whole server) with
// disaggregation_bootstrap_port. The KV cache in use is
// sglang:token_usage.
type sglang struct{}

func (sglang) Kind() Kind         { return SGLang }
func (sglang) HealthPath() string { return "/health" }
func (sglang) InfoPath() string   { return "/get_server_info" }

func (sglang) FromMetrics(f Families) Stats {
	s := f.load("sglang:num_running_reqs", "sglang:num_queue_reqs")
	s.KVUsage = f.kvUsage("sglang:token_usage")
	s.BlockSize, s.CacheTokens = f.infoCache("sglang:cache_config_info", "page_size", "num_pages")
	if s.CacheTokens == 0 {
		ps, ok1 := f.count("sglang:page_size")
		np, ok2 := f.sum("sglang:num_pages")
		if ok1 && ok2 && ps > 0 && ps <= maxBlockSize && np*float64(ps) <= maxCacheTokens {
			s.BlockSize, s.CacheTokens = ps, int64(np)*int64(ps)
		}
	}
	if s.CacheTokens == 0 {
		if t, ok := f.sum("sglang:max_total_num_tokens"); ok && t <= maxCacheTokens {
			s.CacheTokens = int64(t)
		}
	}
	return s
}

func (sglang) FromInfo(b []byte) (Stats, error) {
	var info map[string]any
	if err := json.Unmarshal(b, &info); err != nil {
		return Stats{}, fmt.Errorf("sglang server info: %w", err)
	}
	// The server arguments and the scheduler's figures sit at the top
	// level; per-rank states, where a version reports them, override them
	// (summed over data-parallel ranks).
	read := func(m map[string]any) Stats {
		var s Stats
		if v, ok := jsonCount(m["max_running_requests"], maxCount); ok {
			s.Slots = route.Count32(int(v))
		}
		if v, ok := jsonCount(m["max_total_num_tokens"], maxCacheTokens); ok {
			s.CacheTokens = v
		}
		return s
	}
	var ranks Stats
	states, _ := info["internal_states"].([]any)
	for _, st := range states {
		if m, ok := st.(map[string]any); ok {
			r := read(m)
			ranks.Slots = min(ranks.Slots+r.Slots, maxCount)
			ranks.CacheTokens = min(ranks.CacheTokens+r.CacheTokens, maxCacheTokens)
		}
	}
	s := ranks.Merge(read(info))
	if v, ok := jsonCount(info["page_size"], maxBlockSize); ok && v > 0 {
		s.BlockSize = int(v)
	}
	if mode, ok := info["disaggregation_mode"].(string); ok {
		// "null" (SGLang's spelling of none) and anything unknown say
		// nothing: a whole server.
		if r, err := route.ParseRole(mode); err == nil {
			s.Role = r
		}
	}
	if s.Role == route.RolePrefill {
		if v, ok := jsonCount(info["disaggregation_bootstrap_port"], math.MaxUint16); ok {
			s.Bootstrap = uint16(v)
		}
	}
	return s, nil
}

// kvUsage reads a gauge of the KV cache's share in use (0 to 1), one
// series per engine core or data-parallel rank, each with a cache of its
// own: their mean, in route.EngineLoad.KVUsage's units; 0 when absent.
func (f Families) kvUsage(name string) uint16 {
	total, n := 0.0, 0
	if fam := f[name]; fam != nil {
		for _, m := range fam.GetMetric() {
			if v, ok := value(m); ok {
				total, n = total+min(v, 1), n+1
			}
		}
	}
	if n == 0 {
		return 0
	}
	return uint16(math.Round(total / float64(n) * route.KVFull))
}

// llamacpp reads llama.cpp's llama-server (started with --metrics): GET
// /health (503 while the model loads); llamacpp:requests_processing and
// llamacpp:requests_deferred; and from GET /props total_slots (the slot
// count) and default_generation_settings.n_ctx, the context of one slot.
// Each slot keeps its own prompt cache, so the cache holds slots × n_ctx
// tokens; it is not paged (BlockSize stays unknown).
type llamacpp struct{}

func (llamacpp) Kind() Kind         { return LlamaCpp }
func (llamacpp) HealthPath() string { return "/health" }
func (llamacpp) InfoPath() string   { return "/props" }

func (llamacpp) FromMetrics(f Families) Stats {
	return f.load("llamacpp:requests_processing", "llamacpp:requests_deferred")
}

func (llamacpp) FromInfo(b []byte) (Stats, error) {
	var props struct {
		TotalSlots any `json:"total_slots"`
		Defaults   struct {
			NCtx any `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if err := json.Unmarshal(b, &props); err != nil {
		return Stats{}, fmt.Errorf("llama.cpp props: %w", err)
	}
	var s Stats
	slots, ok1 := jsonCount(props.TotalSlots, maxCount)
	if ok1 {
		s.Slots = route.Count32(int(slots))
	}
	if nctx, ok := jsonCount(props.Defaults.NCtx, maxCacheTokens); ok && ok1 {
		s.CacheTokens = min(nctx*max(slots, 1), maxCacheTokens)
	}
	return s, nil
}

// tgi reads Hugging Face's text-generation-inference router: GET /health;
// tgi_batch_current_size (running) and tgi_queue_size (waiting); and from
// GET /info max_batch_size (the slot count, when the operator set one)
// and max_batch_total_tokens (the tokens a batch may hold, which TGI
// sizes to its KV cache; reported by 1.x and 2.x routers). TGI publishes
// no block size.
type tgi struct{}

func (tgi) Kind() Kind         { return TGI }
func (tgi) HealthPath() string { return "/health" }
func (tgi) InfoPath() string   { return "/info" }

func (tgi) FromMetrics(f Families) Stats {
	return f.load("tgi_batch_current_size", "tgi_queue_size")
}

func (tgi) FromInfo(b []byte) (Stats, error) {
	var info struct {
		MaxBatchSize        any `json:"max_batch_size"`
		MaxBatchTotalTokens any `json:"max_batch_total_tokens"`
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return Stats{}, fmt.Errorf("tgi info: %w", err)
	}
	var s Stats
	if v, ok := jsonCount(info.MaxBatchSize, maxCount); ok {
		s.Slots = route.Count32(int(v))
	}
	if v, ok := jsonCount(info.MaxBatchTotalTokens, maxCacheTokens); ok {
		s.CacheTokens = v
	}
	return s, nil
}
