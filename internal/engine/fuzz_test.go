package engine

import (
	"github.com/kvmesh/kvmesh/route"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds untrusted bytes to every parser a replica's answers
// reach: the metrics page, detection, each adapter's metrics and info
// readers and the models list. None may panic, and what they report stays
// within the bounds a router can use.
func FuzzParse(f *testing.F) {
	pages, _ := filepath.Glob(filepath.Join("testdata", "*.*"))
	for _, p := range pages {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`vllm:cache_config_info{block_size="16",num_gpu_blocks="1e300"} 1` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fams, _ := ParseMetrics(b)
		Detect(fams)
		models, _ := ParseModels(b)
		if l := LoRAsOf(vllm{}.FromMetrics(fams).LoRA, models); l.Len() > route.MaxLoRAEntries {
			t.Fatalf("%d LoRA entries", l.Len())
		}
		for _, k := range append(kinds, Generic) {
			a, err := For(k)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []Stats{a.FromMetrics(fams), infoStats(a, b)} {
				if len(s.LoRA.Running) > maxLoRAList || len(s.LoRA.Waiting) > maxLoRAList || s.LoRA.Max < 0 {
					t.Fatalf("%s: LoRA out of bounds: %+v", k, s.LoRA)
				}
				if s.Running < 0 || s.Waiting < 0 || s.Slots < 0 || s.Slots > maxCount || s.BlockSize < 0 ||
					s.BlockSize > maxBlockSize || s.CacheTokens < 0 || s.CacheTokens > maxCacheTokens {
					t.Fatalf("%s: out of bounds: %+v", k, s)
				}
			}
		}
	})
}

func infoStats(a Adapter, b []byte) Stats {
	s, _ := a.FromInfo(b)
	return s
}
