// Package replicasim is a vLLM-like OpenAI-compatible inference engine for
// machines without a GPU. It serves the same endpoints and Prometheus metrics
// as vLLM (chat, completions, the Responses API with stored responses,
// Anthropic's Messages API and embeddings), keeps a real LRU prefix cache of KV blocks, and spends modelled
// time on queueing, prefill of the uncached prompt and decode, so that a
// router in front of it sees TTFT and cached tokens respond to where
// requests go. The text it generates is deterministic filler.
//
// Tokenization is a documented approximation: one token per 4 bytes of the
// UTF-8 prompt text (a last partial chunk counts as a token). Generated
// tokens are exactly 4 bytes each (" " + a three-letter word), so the text of
// a response re-tokenizes to the same count in the next turn.
package replicasim

import (
	"fmt"
	"slices"
	"time"
)

// bytesPerToken is the tokenization approximation: one token per 4 bytes.
const bytesPerToken = 4

// defaultMaxBody is the request body limit; larger bodies get 413.
const defaultMaxBody = 64 << 20

// Config describes the simulated engine. Zero fields take the defaults
// documented on each field.
type Config struct {
	Model             string  // served model name (default "kvmesh-sim")
	BlockSize         int     // tokens per KV block (default 16, like vLLM)
	KVBlocks          int     // KV cache capacity in blocks (default 8192)
	PrefillTokensPerS float64 // prefill throughput in tokens per second (default 20000)
	DecodeMsPerToken  float64 // milliseconds per output token per sequence (default 10)
	MaxNumSeqs        int     // running sequences cap (default 64); the rest wait FIFO
	MaxModelLen       int     // prompt+max_tokens limit in tokens (default 131072); over it is a 400
	DefaultMaxTokens  int     // output tokens when the request gives none (default 128)
	TimeScale         float64 // >1 runs faster than real time: every modelled duration is divided by it (default 1)
	// Role is the part of disaggregated requests the replica serves
	// (pd.go; default both: whole requests).
	Role Role
	// TransferTokensPerS is how fast a decode pulls a prompt's KV from
	// its prefill replica (default 200000, ten times the prefill).
	TransferTokensPerS float64
	// KVHold is how long a prefill keeps a prompt's KV for its decode
	// (wall time, not scaled: it bounds the router's round trips; default
	// 30 s), and how long a decode waits for its room's prefill.
	KVHold time.Duration
	// LoRAAdapters are the LoRA adapters served on top of Model (vLLM's
	// --lora-modules): a request names one as its model (lora.go).
	LoRAAdapters []string
	MaxLoRAs     int     // adapters resident at once (vLLM's --max-loras; default 1)
	LoRALoadMs   float64 // time to load an adapter that is not resident (default 50)
	// StallAfter freezes the engine once this many generation requests
	// were admitted, as POST /debug/stall does (0: never by itself).
	StallAfter int
}

// maxLoRAAdapters bounds the adapters a replica serves.
const maxLoRAAdapters = 1024

// withDefaults fills zero fields and rejects negative ones.
func (c Config) withDefaults() (Config, error) {
	if c.Model == "" {
		c.Model = "kvmesh-sim"
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"block size", &c.BlockSize, 16},
		{"kv blocks", &c.KVBlocks, 8192},
		{"max num seqs", &c.MaxNumSeqs, 64},
		{"max model len", &c.MaxModelLen, 131072},
		{"default max tokens", &c.DefaultMaxTokens, 128},
		{"max loras", &c.MaxLoRAs, 1},
		{"stall after", &c.StallAfter, 0},
	}
	for _, f := range ints {
		if *f.v < 0 {
			return c, fmt.Errorf("replicasim config: %s %d is negative", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	floats := []struct {
		name string
		v    *float64
		def  float64
	}{
		{"prefill tokens per second", &c.PrefillTokensPerS, 20000},
		{"decode ms per token", &c.DecodeMsPerToken, 10},
		{"time scale", &c.TimeScale, 1},
		{"transfer tokens per second", &c.TransferTokensPerS, 200000},
		{"lora load ms", &c.LoRALoadMs, 50},
	}
	for _, f := range floats {
		if *f.v < 0 || *f.v != *f.v { // negative or NaN
			return c, fmt.Errorf("replicasim config: %s %v is invalid", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	r, err := ParseRole(string(c.Role))
	if err != nil {
		return c, fmt.Errorf("replicasim config: %w", err)
	}
	c.Role = r
	if c.KVHold < 0 {
		return c, fmt.Errorf("replicasim config: kv hold %v is negative", c.KVHold)
	}
	if c.KVHold == 0 {
		c.KVHold = 30 * time.Second
	}
	if len(c.LoRAAdapters) > maxLoRAAdapters {
		return c, fmt.Errorf("replicasim config: %d LoRA adapters, at most %d", len(c.LoRAAdapters), maxLoRAAdapters)
	}
	for i, a := range c.LoRAAdapters {
		if a == "" || a == c.Model || slices.Contains(c.LoRAAdapters[:i], a) {
			return c, fmt.Errorf("replicasim config: LoRA adapter %q is empty, the base model's name or given twice", a)
		}
	}
	return c, nil
}
