package replicasim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestLoRAModelsAndNotFound: /v1/models lists each adapter with the base
// model as its parent, a request for an adapter is answered under the
// adapter's name, and one for an adapter the replica does not serve gets
// vLLM's 404.
func TestLoRAModelsAndNotFound(t *testing.T) {
	h := newHarness(t, Config{TimeScale: fast, LoRAAdapters: []string{"sql", "chat"}, MaxLoRAs: 1})
	resp, err := h.c.Get(h.ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || len(list.Data) != 3 {
		t.Fatalf("models %+v %v", list, err)
	}
	for i, want := range []string{"kvmesh-sim", "sql", "chat"} {
		d := list.Data[i]
		if d.ID != want || (i == 0) != (d.Parent == nil) || (i > 0 && *d.Parent != "kvmesh-sim") {
			t.Errorf("entry %d: %+v", i, d)
		}
	}
	r := h.post(context.Background(), "/v1/chat/completions", map[string]any{"model": "sql",
		"messages": []map[string]any{{"role": "user", "content": "hi"}}, "max_tokens": 2})
	var out struct {
		Model string `json:"model"`
	}
	err = json.NewDecoder(r.Body).Decode(&out)
	r.Body.Close()
	if r.StatusCode != http.StatusOK || err != nil || out.Model != "sql" {
		t.Fatalf("adapter request: %d %+v %v", r.StatusCode, out, err)
	}
	r = h.post(context.Background(), "/v1/chat/completions", map[string]any{"model": "legal",
		"messages": []map[string]any{{"role": "user", "content": "hi"}}, "max_tokens": 2})
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "The model `legal` does not exist.") {
		t.Fatalf("unknown adapter: %d %s", r.StatusCode, b)
	}
}

// TestLoRAResidencyAndCacheScope: an adapter is loaded on first use and
// stays resident while it fits; the least recently used idle one is
// evicted for another; one prompt under two adapters shares no cached
// block, under one adapter it does.
func TestLoRAResidencyAndCacheScope(t *testing.T) {
	h := newHarness(t, Config{TimeScale: fast, LoRAAdapters: []string{"a", "b", "c"}, MaxLoRAs: 2})
	ask := func(model string) int {
		t.Helper()
		res := h.generate("/v1/chat/completions", map[string]any{"model": model,
			"messages": []map[string]any{{"role": "system", "content": longSystem}, {"role": "user", "content": "hello"}}, "max_tokens": 2})
		return res.Usage.PromptTokensDetails.CachedTokens
	}
	if c := ask("a"); c != 0 || !h.s.Resident("a") || h.metric("replicasim_lora_loads_total") != 1 {
		t.Fatalf("first a: cached %d, resident %v", c, h.s.Resident("a"))
	}
	if c := ask("a"); c == 0 || h.metric("replicasim_lora_loads_total") != 1 {
		t.Fatalf("a again: cached %d, loads %v", c, h.metric("replicasim_lora_loads_total"))
	}
	if c := ask("b"); c != 0 {
		t.Fatalf("the same prompt under b hit a's blocks: %d cached", c)
	}
	if c := ask("kvmesh-sim"); c != 0 {
		t.Fatalf("the base model hit an adapter's blocks: %d cached", c)
	}
	ask("a") // a is now the most recently used
	ask("c") // evicts b
	if h.s.Resident("b") || !h.s.Resident("a") || !h.s.Resident("c") || h.metric("replicasim_lora_loads_total") != 3 {
		t.Fatalf("after c: a %v b %v c %v", h.s.Resident("a"), h.s.Resident("b"), h.s.Resident("c"))
	}
}

// TestLoRAWaitsForASlotAndPublishesIt: with one adapter slot, a request
// of another adapter waits while the first runs, a base model's request
// does not, and vllm:lora_requests_info's latest series tells both, as
// vLLM's does; the waiting one runs once the first ends.
func TestLoRAWaitsForASlotAndPublishesIt(t *testing.T) {
	h := newHarness(t, Config{TimeScale: 100, DecodeMsPerToken: 10, LoRAAdapters: []string{"a", "b"}, MaxLoRAs: 1, LoRALoadMs: 1})
	long := func(model string, tokens int) chan int {
		done := make(chan int, 1)
		go func() {
			r := h.post(context.Background(), "/v1/chat/completions", map[string]any{"model": model,
				"messages": []map[string]any{{"role": "user", "content": "x"}}, "max_tokens": tokens})
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
			done <- r.StatusCode
		}()
		return done
	}
	a := long("a", 2000) // 200 ms at this scale
	eventually(t, "a runs", func() bool { return h.metric("vllm:num_requests_running") == 1 })
	b := long("b", 2)
	eventually(t, "b waits", func() bool { return h.metric("vllm:num_requests_waiting") == 1 })
	base := long("kvmesh-sim", 2)
	if code := <-base; code != http.StatusOK {
		t.Fatalf("base model: %d", code)
	}
	latest := func() map[string]string {
		mfs, err := h.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out, at := map[string]string{}, -1.0
		for _, mf := range mfs {
			if mf.GetName() != "vllm:lora_requests_info" {
				continue
			}
			for _, m := range mf.GetMetric() {
				if v := m.GetGauge().GetValue(); v >= at {
					at, out = v, map[string]string{}
					for _, l := range m.GetLabel() {
						out[l.GetName()] = l.GetValue()
					}
				}
			}
		}
		return out
	}
	if l := latest(); l["max_lora"] != "1" || l["running_lora_adapters"] != "a" || l["waiting_lora_adapters"] != "b" {
		t.Fatalf("while a runs and b waits: %v", l)
	}
	for _, ch := range []chan int{a, b} {
		select {
		case code := <-ch:
			if code != http.StatusOK {
				t.Fatalf("status %d", code)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a request never ended")
		}
	}
	if l := latest(); l["running_lora_adapters"] != "" || l["waiting_lora_adapters"] != "" || !h.s.Resident("b") || h.s.Resident("a") {
		t.Fatalf("idle: %v, resident a %v b %v", l, h.s.Resident("a"), h.s.Resident("b"))
	}
}

// TestLoRAConfig: adapters must be named, distinct and not the base model.
func TestLoRAConfig(t *testing.T) {
	for _, bad := range [][]string{{""}, {"a", "a"}, {"kvmesh-sim"}} {
		if _, err := (Config{LoRAAdapters: bad}).withDefaults(); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if c, err := (Config{LoRAAdapters: []string{"a"}}).withDefaults(); err != nil || c.MaxLoRAs != 1 || c.LoRALoadMs != 50 {
		t.Errorf("defaults %+v %v", c, err)
	}
	if _, err := (Config{MaxLoRAs: -1}).withDefaults(); err == nil {
		t.Error("negative max loras accepted")
	}
}
