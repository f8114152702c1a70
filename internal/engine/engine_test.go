package engine

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/route"
)

func readPage(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRecordedPages: each engine's recorded /metrics page is detected as
// that engine, and its adapter reads the load and cache the page holds,
// completed by the engine's info endpoint.
func TestRecordedPages(t *testing.T) {
	tests := []struct {
		metrics, info string
		kind          Kind
		fromMetrics   Stats
		fromInfo      Stats
		health        string
	}{
		{"vllm.metrics.txt", "", VLLM,
			Stats{EngineLoad: route.EngineLoad{Running: 3, Waiting: 2, KVUsage: 4127, HasLoad: true}, BlockSize: 16, CacheTokens: 27644 * 16}, Stats{}, "/health"},
		{"vllm-lora.metrics.txt", "", VLLM,
			Stats{EngineLoad: route.EngineLoad{Running: 3, Waiting: 2, KVUsage: 4127, HasLoad: true}, BlockSize: 16, CacheTokens: 27644 * 16,
				LoRA: LoRAInfo{Max: 2, Loaded: "chat-lora,sql-lora", Running: "sql-lora,chat-lora", Waiting: "legal-lora"}}, Stats{}, "/health"},
		{"sglang.metrics.txt", "sglang.server_info.json", SGLang,
			Stats{EngineLoad: route.EngineLoad{Running: 12, Waiting: 5, KVUsage: 2500, HasLoad: true}, CacheTokens: 489602},
			Stats{EngineLoad: route.EngineLoad{Slots: 48}, BlockSize: 1, CacheTokens: 489602}, "/health"},
		{"llamacpp.metrics.txt", "llamacpp.props.json", LlamaCpp,
			Stats{EngineLoad: route.EngineLoad{Running: 4, Waiting: 3, HasLoad: true}},
			Stats{EngineLoad: route.EngineLoad{Slots: 4}, CacheTokens: 4 * 8192}, "/health"},
		// Captured from a real llama-server b11312 (-np 4 -c 16384
		// --no-kv-unified) with 6 requests sent at once.
		{"llamacpp-b11312.metrics.txt", "llamacpp-b11312.props.json", LlamaCpp,
			Stats{EngineLoad: route.EngineLoad{Running: 4, Waiting: 2, HasLoad: true}},
			Stats{EngineLoad: route.EngineLoad{Slots: 4}, CacheTokens: 4 * 4096}, "/health"},
		{"tgi.metrics.txt", "tgi.info.json", TGI,
			Stats{EngineLoad: route.EngineLoad{Running: 7, Waiting: 2, HasLoad: true}},
			Stats{CacheTokens: 153104}, "/health"},
	}
	for _, tc := range tests {
		t.Run(tc.metrics, func(t *testing.T) {
			fams, err := ParseMetrics(readPage(t, tc.metrics))
			if err != nil {
				t.Fatal(err)
			}
			k, ok := Detect(fams)
			if !ok || k != tc.kind {
				t.Fatalf("detected %q %v, want %q", k, ok, tc.kind)
			}
			a, err := For(k)
			if err != nil {
				t.Fatal(err)
			}
			if a.Kind() != tc.kind || a.HealthPath() != tc.health {
				t.Errorf("adapter %q health %q", a.Kind(), a.HealthPath())
			}
			if got := a.FromMetrics(fams); got != tc.fromMetrics {
				t.Errorf("from metrics %+v, want %+v", got, tc.fromMetrics)
			}
			if tc.info == "" {
				if a.InfoPath() != "" {
					t.Errorf("info path %q, want none", a.InfoPath())
				}
				return
			}
			if a.InfoPath() == "" {
				t.Fatal("no info path")
			}
			got, err := a.FromInfo(readPage(t, tc.info))
			if err != nil || got != tc.fromInfo {
				t.Errorf("from info %+v %v, want %+v", got, err, tc.fromInfo)
			}
			if _, err := a.FromInfo([]byte("<html>")); err == nil {
				t.Error("junk info parsed")
			}
		})
	}
}

// TestLlamaCppSlotsAgreeWithProps: the adapter takes llama.cpp's cache as
// total_slots × the per-slot n_ctx of /props; the real engine's /slots
// (captured with the /props beside it, every slot busy) lists that many
// slots of that context, and its busy slots are the requests_processing
// its /metrics page reports.
func TestLlamaCppSlotsAgreeWithProps(t *testing.T) {
	var slots []struct {
		ID           int  `json:"id"`
		NCtx         int  `json:"n_ctx"`
		IsProcessing bool `json:"is_processing"`
	}
	if err := json.Unmarshal(readPage(t, "llamacpp-b11312.slots.json"), &slots); err != nil {
		t.Fatal(err)
	}
	info, err := llamacpp{}.FromInfo(readPage(t, "llamacpp-b11312.props.json"))
	if err != nil {
		t.Fatal(err)
	}
	fams, err := ParseMetrics(readPage(t, "llamacpp-b11312.metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	load := llamacpp{}.FromMetrics(fams)
	if len(slots) != int(info.Slots) {
		t.Fatalf("/slots lists %d slots, /props total_slots %d", len(slots), info.Slots)
	}
	var ctx int64
	busy := 0
	for _, s := range slots {
		ctx += int64(s.NCtx)
		if s.IsProcessing {
			busy++
		}
	}
	if ctx != info.CacheTokens {
		t.Errorf("/slots n_ctx sum %d, adapter's cache %d tokens", ctx, info.CacheTokens)
	}
	if busy != int(load.Running) {
		t.Errorf("%d slots processing, metrics say %d running", busy, load.Running)
	}
}

// TestDetectEachPageOnlyOnce: no recorded page carries another engine's
// load gauges, so auto cannot mistake one engine for another.
func TestDetectEachPageOnlyOnce(t *testing.T) {
	pages := map[Kind]string{VLLM: "vllm.metrics.txt", SGLang: "sglang.metrics.txt", LlamaCpp: "llamacpp.metrics.txt", TGI: "tgi.metrics.txt"}
	for k, page := range pages {
		fams, _ := ParseMetrics(readPage(t, page))
		for other := range pages {
			a, _ := For(other)
			if s := a.FromMetrics(fams); other != k && s.HasLoad {
				t.Errorf("%s adapter reads load from the %s page", other, k)
			}
		}
	}
}

func TestMetricsVariants(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		page string
		want Stats
	}{
		{"vllm kv_cache_size_tokens only", VLLM,
			`vllm:cache_config_info{block_size="16",kv_cache_size_tokens="123433",num_gpu_blocks="None"} 1.0` + "\n",
			Stats{CacheTokens: 123433}},
		{"vllm not initialised", VLLM,
			`vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0` + "\nvllm:num_requests_running 0\n",
			Stats{EngineLoad: route.EngineLoad{HasLoad: true}}},
		{"vllm two engine cores are summed", VLLM, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="100"} 1.0
`, Stats{EngineLoad: route.EngineLoad{Running: 7, Waiting: 1, HasLoad: true}, BlockSize: 16, CacheTokens: 3200}},
		{"vllm junk values are unknown", VLLM,
			"vllm:num_requests_running NaN\nvllm:num_requests_waiting -3\n" +
				`vllm:cache_config_info{block_size="-16",num_gpu_blocks="10"} 1` + "\n",
			Stats{}},
		{"vllm fractional label", VLLM, `vllm:cache_config_info{block_size="16.5",num_gpu_blocks="10"} 1` + "\n", Stats{}},
		{"sglang cache_config_info", SGLang,
			`sglang:cache_config_info{model_name="m",num_pages="2000",page_size="64"} 1` + "\nsglang:max_total_num_tokens 5\n",
			Stats{BlockSize: 64, CacheTokens: 128000}},
		{"sglang page gauges", SGLang,
			"sglang:page_size 16\nsglang:num_pages 1000\nsglang:num_running_reqs 1\n",
			Stats{EngineLoad: route.EngineLoad{Running: 1, HasLoad: true}, BlockSize: 16, CacheTokens: 16000}},
		{"llamacpp waiting only", LlamaCpp, "llamacpp:requests_deferred 2\n", Stats{EngineLoad: route.EngineLoad{Waiting: 2, HasLoad: true}}},
		{"tgi absent", TGI, "other 1\n", Stats{}},
		{"generic knows nothing", Generic, "vllm:num_requests_running 1\n", Stats{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fams, err := ParseMetrics([]byte(tc.page))
			if err != nil {
				t.Fatal(err)
			}
			a, _ := For(tc.kind)
			if got := a.FromMetrics(fams); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestInfoVariants(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		body string
		want Stats
	}{
		{"sglang per-rank states override", SGLang,
			`{"max_running_requests":null,"max_total_num_tokens":900,"page_size":16,"internal_states":[{"max_running_requests":32,"max_total_num_tokens":400},{"max_running_requests":32,"max_total_num_tokens":400}]}`,
			Stats{EngineLoad: route.EngineLoad{Slots: 64}, BlockSize: 16, CacheTokens: 800}},
		{"sglang unset slots", SGLang, `{"max_running_requests":null,"max_total_num_tokens":900}`, Stats{CacheTokens: 900}},
		{"sglang prefill server", SGLang, `{"disaggregation_mode":"prefill","disaggregation_bootstrap_port":8998}`,
			Stats{Role: route.RolePrefill, Bootstrap: 8998}},
		{"sglang decode server: no bootstrap port", SGLang, `{"disaggregation_mode":"decode","disaggregation_bootstrap_port":8998}`,
			Stats{Role: route.RoleDecode}},
		{"sglang whole server", SGLang, `{"disaggregation_mode":"null","disaggregation_bootstrap_port":8998}`, Stats{}},
		{"sglang junk mode and port", SGLang, `{"disaggregation_mode":7,"disaggregation_bootstrap_port":70000}`, Stats{}},
		{"sglang prefill, port out of range", SGLang, `{"disaggregation_mode":"PREFILL","disaggregation_bootstrap_port":65536}`,
			Stats{Role: route.RolePrefill}},
		{"tgi 3.x has no batch fields", TGI, `{"model_id":"m","max_concurrent_requests":128,"max_total_tokens":4096}`, Stats{}},
		{"tgi batch size set", TGI, `{"max_batch_size":32,"max_batch_total_tokens":null}`, Stats{EngineLoad: route.EngineLoad{Slots: 32}}},
		{"llamacpp slots without context", LlamaCpp, `{"total_slots":2}`, Stats{EngineLoad: route.EngineLoad{Slots: 2}}},
		{"llamacpp junk types", LlamaCpp, `{"total_slots":"four","default_generation_settings":{"n_ctx":-1}}`, Stats{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := For(tc.kind)
			got, err := a.FromInfo([]byte(tc.body))
			if err != nil || got != tc.want {
				t.Errorf("got %+v %v, want %+v", got, err, tc.want)
			}
		})
	}
}

func TestDetect(t *testing.T) {
	tests := []struct {
		page string
		want Kind
		ok   bool
	}{
		{"# no engine here\nup 1\n", "", false},
		{"", "", false},
		{"sglang:token_usage 0.1\n", SGLang, true},   // prefix only: still starting
		{"tgi_request_count 3\n", TGI, true},         // prefix only
		{"vllm:kv_cache_usage_perc 0\n", VLLM, true}, // prefix only
		{"llamacpp:prompt_tokens_total 1\n", LlamaCpp, true},
	}
	for _, tc := range tests {
		fams, _ := ParseMetrics([]byte(tc.page))
		if k, ok := Detect(fams); k != tc.want || ok != tc.ok {
			t.Errorf("%q: %q %v, want %q %v", tc.page, k, ok, tc.want, tc.ok)
		}
	}
}

// TestParseKeepsFamiliesBeforeAnError: a malformed line late in a page
// leaves the gauges before it readable.
func TestParseKeepsFamiliesBeforeAnError(t *testing.T) {
	page := "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\nthis is { not a metric\n"
	fams, err := ParseMetrics([]byte(page))
	if err == nil {
		t.Fatal("no error for a malformed page")
	}
	if got := (vllm{}).FromMetrics(fams); got != (Stats{EngineLoad: route.EngineLoad{Running: 2, Waiting: 1, HasLoad: true}}) {
		t.Errorf("got %+v", got)
	}
}

func TestParseKind(t *testing.T) {
	for _, s := range []string{"auto", "VLLM", " sglang", "llamacpp", "tgi", "openai"} {
		if _, err := ParseKind(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"", "ollama", "vllm:"} {
		if _, err := ParseKind(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
	if _, err := For(Auto); err == nil {
		t.Error("an adapter for auto")
	}
}

func TestParseModels(t *testing.T) {
	got, err := ParseModels([]byte(`{"object":"list","data":[{"id":"b"},{"id":"a"},{"id":""},{"id":"b"}]}`))
	if err != nil || !slices.Equal(got.Models, []string{"a", "b"}) || got.Adapters != nil || !slices.Equal(got.Bases(), got.Models) {
		t.Errorf("got %v %v", got, err)
	}
	if _, err := ParseModels([]byte("not json")); err == nil {
		t.Error("junk parsed")
	}
	// vLLM with LoRA adapters: each lists its base model as parent.
	got, err = ParseModels(readPage(t, "vllm-lora.models.json"))
	base := "meta-llama/Llama-3.1-8B-Instruct"
	if err != nil || !slices.Equal(got.Models, []string{"chat-lora", "legal-lora", base, "sql-lora"}) ||
		!slices.Equal(got.Adapters, []string{"chat-lora", "legal-lora", "sql-lora"}) || !slices.Equal(got.Bases(), []string{base}) {
		t.Errorf("lora models: %+v %v", got, err)
	}
}

// TestLoRAsOf: vLLM's LoRA gauge (its latest series) and model list make
// the LoRAs the mesh gossips: the base model told from the adapters, the
// running and waiting ones, the limit; after a failed scrape the limit
// and the base model stay.
func TestLoRAsOf(t *testing.T) {
	fams, err := ParseMetrics(readPage(t, "vllm-lora.metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := For(VLLM)
	st := a.FromMetrics(fams)
	if st.LoRA != (LoRAInfo{Max: 2, Loaded: "chat-lora,sql-lora", Running: "sql-lora,chat-lora", Waiting: "legal-lora"}) {
		t.Fatalf("lora info %+v", st.LoRA)
	}
	models, err := ParseModels(readPage(t, "vllm-lora.models.json"))
	if err != nil {
		t.Fatal(err)
	}
	l := LoRAsOf(st.LoRA, models)
	want := map[string]route.LoRAFit{
		"meta-llama/Llama-3.1-8B-Instruct": 0,
		"sql-lora":                         route.LoRAAdapter | route.LoRAResident,
		"chat-lora":                        route.LoRAAdapter | route.LoRAResident,
		"legal-lora":                       route.LoRAAdapter | route.LoRAWaiting,
	}
	for m, f := range want {
		if got := l.Fit(route.LoRAID(m)); got != f {
			t.Errorf("%s: fit %04b, want %04b", m, got, f)
		}
	}
	if l.Max != 2 || l.Active != 3 || l.Resident != 2 {
		t.Errorf("%+v", l)
	}
	forgot := LoRAsOf(st.Forget().LoRA, models)
	if forgot.Max != 2 || forgot.Fit(route.LoRAID("sql-lora")) != route.LoRAAdapter|route.LoRARoom|route.LoRAFree ||
		forgot.Fit(route.LoRAID("meta-llama/Llama-3.1-8B-Instruct")) != 0 {
		t.Errorf("after a failed scrape: %+v", forgot)
	}
	// No LoRA anywhere: nothing.
	plain, _ := ParseModels([]byte(`{"data":[{"id":"m","parent":null}]}`))
	if got := LoRAsOf(LoRAInfo{}, plain); got.Known() {
		t.Errorf("an engine without LoRA: %+v", got)
	}
	// LoRA on, no adapter registered yet: the limit alone, the model a base.
	if got := LoRAsOf(LoRAInfo{Max: 4}, plain); got.Fit(route.LoRAID("m")) != 0 || got.Fit(route.LoRAID("new")) != route.LoRAAdapter|route.LoRARoom|route.LoRAFree {
		t.Errorf("limit alone: %+v", got)
	}
}

// TestLoRAInfoLatestSeries: the latest series is the present; the
// adapters loaded are the limit's most recently named running over every
// series (an idle engine's present names none while they stay loaded);
// with no limit known, those of the latest series naming any; an
// oversized list is cut at a name.
func TestLoRAInfoLatestSeries(t *testing.T) {
	page := func(max string) []byte {
		return []byte(`vllm:lora_requests_info{max_lora="` + max + `",running_lora_adapters="c",waiting_lora_adapters=""} 1.6e+09
vllm:lora_requests_info{max_lora="` + max + `",running_lora_adapters="b,a",waiting_lora_adapters="c"} 1.7e+09
vllm:lora_requests_info{max_lora="` + max + `",running_lora_adapters="",waiting_lora_adapters=""} 1.8e+09
`)
	}
	for _, tc := range []struct {
		max  string
		want LoRAInfo
	}{
		{"4", LoRAInfo{Max: 4, Loaded: "a,b,c"}},
		{"2", LoRAInfo{Max: 2, Loaded: "a,b"}},
		{"", LoRAInfo{Loaded: "b,a"}},
	} {
		fams, _ := ParseMetrics(page(tc.max))
		if got := fams.loraInfo("vllm:lora_requests_info"); got != tc.want {
			t.Errorf("max %q: %+v, want %+v", tc.max, got, tc.want)
		}
	}
	fams, _ := ParseMetrics([]byte(`vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",waiting_lora_adapters="b"} 1.9e+09` + "\n"))
	if got := fams.loraInfo("vllm:lora_requests_info"); got != (LoRAInfo{Max: 4, Loaded: "a", Running: "a", Waiting: "b"}) {
		t.Errorf("busy engine: %+v", got)
	}
	fams, _ = ParseMetrics([]byte(`vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.8e+09` + "\n"))
	if got := fams.loraInfo("vllm:lora_requests_info"); got != (LoRAInfo{Max: 4}) {
		t.Errorf("no adapter ever ran: %+v", got)
	}
	long := strings.Repeat("adapter-with-a-long-name,", 1000)
	fams, _ = ParseMetrics([]byte(`vllm:lora_requests_info{max_lora="x",running_lora_adapters="` + long + `"} 1` + "\n"))
	got := fams.loraInfo("vllm:lora_requests_info")
	if got.Max != 0 || len(got.Running) > maxLoRAList || !strings.HasSuffix(got.Running, "adapter-with-a-long-name") {
		t.Errorf("long list: max %d, %d bytes", got.Max, len(got.Running))
	}
}

func TestMerge(t *testing.T) {
	a := Stats{EngineLoad: route.EngineLoad{Running: 1, HasLoad: true}, CacheTokens: 5}
	b := Stats{EngineLoad: route.EngineLoad{Running: 9, Waiting: 9, HasLoad: true, Slots: 4}, BlockSize: 16, CacheTokens: 7}
	if got := a.Merge(b); got != (Stats{EngineLoad: route.EngineLoad{Running: 1, HasLoad: true, Slots: 4}, BlockSize: 16, CacheTokens: 5}) {
		t.Errorf("got %+v", got)
	}
	if got := (Stats{}).Merge(b); got != b {
		t.Errorf("got %+v", got)
	}
}

// TestReplicaSimReadsAsVLLM: kvmesh's replica-sim publishes its load and
// cache under vLLM's names, so auto picks the vLLM adapter for it.
func TestReplicaSimReadsAsVLLM(t *testing.T) {
	sim, err := replicasim.New(replicasim.Config{BlockSize: 16, KVBlocks: 1000, MaxNumSeqs: 8}, hclog.NewNullLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fams, err := ParseMetrics(b)
	if err != nil {
		t.Fatalf("%v in\n%s", err, b)
	}
	if k, ok := Detect(fams); !ok || k != VLLM {
		t.Fatalf("detected %q", k)
	}
	if got := (vllm{}).FromMetrics(fams); got != (Stats{EngineLoad: route.EngineLoad{HasLoad: true}, BlockSize: 16, CacheTokens: 16000}) {
		t.Errorf("got %+v", got)
	}
}

// TestReplicaSimLoRAReadsAsVLLM: replica-sim's LoRA adapters read as
// vLLM's: the limit and the adapters in use from vllm:lora_requests_info,
// the adapters from /v1/models' parents.
func TestReplicaSimLoRAReadsAsVLLM(t *testing.T) {
	sim, err := replicasim.New(replicasim.Config{TimeScale: 1e6, LoRAAdapters: []string{"sql", "chat"}, MaxLoRAs: 2},
		hclog.NewNullLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()
	get := func(path string) []byte {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	fams, err := ParseMetrics(get("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	info := (vllm{}).FromMetrics(fams).LoRA
	models, err := ParseModels(get("/v1/models"))
	if err != nil || info != (LoRAInfo{Max: 2}) || !slices.Equal(models.Adapters, []string{"chat", "sql"}) {
		t.Fatalf("info %+v models %+v %v", info, models, err)
	}
	l := LoRAsOf(info, models)
	if l.Fit(route.LoRAID("kvmesh-sim")) != 0 || l.Fit(route.LoRAID("sql")) != route.LoRAAdapter|route.LoRARoom|route.LoRAFree {
		t.Fatalf("%+v", l)
	}
}

// TestKVUsage: the KV cache's share in use is the mean of the engine
// cores' (each has a cache of its own), clamped to the whole cache;
// vLLM's name before 0.10 is read when the newer is absent, and an
// engine without either reports 0, unknown.
func TestKVUsage(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		kind       Kind
		want       uint16
	}{
		{"vllm two cores", "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.25\n", VLLM, 3750},
		{"vllm before 0.10", "vllm:gpu_cache_usage_perc 0.8\n", VLLM, 8000},
		{"vllm over 1", "vllm:kv_cache_usage_perc 1.5\n", VLLM, route.KVFull},
		{"vllm without", "vllm:num_requests_running 1\n", VLLM, 0},
		{"sglang", "sglang:token_usage{tp_rank=\"0\"} 0.99\n", SGLang, 9900},
		{"llama.cpp publishes none", "llamacpp:kv_cache_usage_ratio 0.5\n", LlamaCpp, 0},
	} {
		fams, err := ParseMetrics([]byte(tc.page))
		if err != nil {
			t.Fatal(err)
		}
		a, err := For(tc.kind)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.FromMetrics(fams).KVUsage; got != tc.want {
			t.Errorf("%s: KV usage %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestSharesQueuedPrefill: vLLM queues requests in one scheduler over one
// paged cache (shares), llama.cpp computes each in its own slot (does
// not); the others are not known, and an unknown kind is not either.
func TestSharesQueuedPrefill(t *testing.T) {
	for _, tc := range []struct {
		k             Kind
		shares, known bool
	}{
		{VLLM, true, true}, {LlamaCpp, false, true}, {SGLang, false, false}, {TGI, false, false},
		{Generic, false, false}, {"", false, false}, {Kind("other"), false, false},
	} {
		if s, k := tc.k.SharesQueuedPrefill(); s != tc.shares || k != tc.known {
			t.Errorf("%q: shares %v known %v, want %v %v", tc.k, s, k, tc.shares, tc.known)
		}
	}
}
