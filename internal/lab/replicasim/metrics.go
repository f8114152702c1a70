package replicasim

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the vLLM metric families a router or dashboard scrapes, with
// vLLM's names and its model_name label.
type metrics struct {
	running, waiting prometheus.Gauge
	prefixQueries    prometheus.Counter
	prefixHits       prometheus.Counter
	promptTokens     prometheus.Counter
	generationTokens prometheus.Counter
	ttft             prometheus.Histogram
	// With LoRA adapters only: vLLM's vllm:lora_requests_info, and the
	// simulator's own count of adapter loads.
	loraInfo   *prometheus.GaugeVec
	loraLoads  prometheus.Counter
	collectors []prometheus.Collector
}

// ttftBuckets are vLLM's time_to_first_token_seconds buckets.
var ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
	0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

func newMetrics(cfg Config, kvUsage func() float64) *metrics {
	model := prometheus.Labels{"model_name": cfg.Model}
	m := &metrics{
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:num_requests_running",
			Help: "Number of requests in model execution batches.", ConstLabels: model}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:num_requests_waiting",
			Help: "Number of requests waiting to be processed.", ConstLabels: model}),
		prefixQueries: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_queries_total",
			Help: "Prefix cache queries, in terms of number of queried tokens.", ConstLabels: model}),
		prefixHits: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prefix_cache_hits_total",
			Help: "Prefix cache hits, in terms of number of cached tokens.", ConstLabels: model}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:prompt_tokens_total",
			Help: "Number of prefill tokens processed.", ConstLabels: model}),
		generationTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:generation_tokens_total",
			Help: "Number of generation tokens processed.", ConstLabels: model}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
			Help:    "Histogram of time to first token in seconds (wall clock, after time scaling).",
			Buckets: ttftBuckets, ConstLabels: model}),
	}
	usage := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:kv_cache_usage_perc",
		Help: "KV-cache usage. 1 means 100 percent usage.", ConstLabels: model}, kvUsage)
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info",
		Help: "Information of the LLMEngine CacheConfig.",
		ConstLabels: prometheus.Labels{
			"block_size":     strconv.Itoa(cfg.BlockSize),
			"num_gpu_blocks": strconv.Itoa(cfg.KVBlocks),
		}})
	info.Set(1)
	m.collectors = []prometheus.Collector{m.running, m.waiting, m.prefixQueries, m.prefixHits,
		m.promptTokens, m.generationTokens, m.ttft, usage, info}
	if len(cfg.LoRAAdapters) > 0 {
		m.loraInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:lora_requests_info",
			Help: "Running stats on lora requests."}, []string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"})
		m.loraLoads = prometheus.NewCounter(prometheus.CounterOpts{Name: "replicasim_lora_loads_total",
			Help: "LoRA adapters loaded because a request needed one that was not resident (the simulator's own; vLLM publishes none)."})
		m.collectors = append(m.collectors, m.loraInfo, m.loraLoads)
	}
	return m
}

// register adds every family to reg, undoing partial work on failure so a
// failed New leaves the registry as it was.
func (m *metrics) register(reg prometheus.Registerer) error {
	for i, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range m.collectors[:i] {
				reg.Unregister(done)
			}
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return fmt.Errorf("register replicasim metrics: already registered (one registry per replica): %w", err)
			}
			return fmt.Errorf("register replicasim metrics: %w", err)
		}
	}
	return nil
}
