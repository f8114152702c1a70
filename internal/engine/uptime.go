package engine

import (
	"math"

	dto "github.com/prometheus/client_model/go"
)

// Uptime is what tells one run of an engine's process from the next on
// its /metrics: the process's start time (prometheus_client's
// process_start_time_seconds) where it publishes one, and the sum of
// each of its counter families, which a restart sets back to zero.
type Uptime struct {
	// Start is the process's start, in seconds since the epoch (0: not
	// published).
	Start float64
	// Counters is each counter family's sum, by name.
	Counters map[string]float64
}

// ReadUptime reads the uptime evidence of one /metrics page.
func ReadUptime(f Families) Uptime {
	var u Uptime
	if s, ok := f.sum("process_start_time_seconds"); ok && len(f["process_start_time_seconds"].GetMetric()) == 1 {
		u.Start = s
	}
	for name, fam := range f {
		if fam.GetType() != dto.MetricType_COUNTER {
			continue
		}
		if v, ok := f.sum(name); ok {
			if u.Counters == nil {
				u.Counters = map[string]float64{}
			}
			u.Counters[name] = v
		}
	}
	return u
}

// Known reports whether u can tell a restart at all.
func (u Uptime) Known() bool { return u.Start > 0 || len(u.Counters) > 0 }

// RestartedSince reports whether u is of a later run of the engine than
// prev. A published start time decides alone (a change of more than a
// second: some exporters derive it from the boot time and clock ticks).
// Otherwise the counters do: a restart sets every one back, so at least
// half of those that were positive in prev must have gone down (an
// engine may type a gauge as a counter, as llama.cpp does its busy slots
// per decode, and one such family going down is no restart).
func (u Uptime) RestartedSince(prev Uptime) bool {
	if u.Start > 0 && prev.Start > 0 {
		return math.Abs(u.Start-prev.Start) > 1
	}
	if u.Start > 0 || prev.Start > 0 {
		return false // published by one run and not the other: no evidence either way
	}
	positive, down := 0, 0
	for name, was := range prev.Counters {
		now, ok := u.Counters[name]
		if !ok || was <= 0 {
			continue
		}
		positive++
		if now < was {
			down++
		}
	}
	return down > 0 && 2*down >= positive
}

// progressCounters are the counter families an engine moves as it
// works: the tokens it generated, the prompt tokens it prefilled, the
// forward passes it ran. A stalled engine's all stand still; a working
// one moves at least one of them every step it completes (a step is
// one forward pass, so a single long prefill step moves none until it
// ends: the router's own estimate of the prefill it sent covers that,
// proxy/stall.go). Engines count prompt tokens when a prompt's prefill
// completes, generated tokens as they come, and llama.cpp its decode
// calls, TGI its prefill and decode batches, as each pass ends.
var progressCounters = [...]string{
	"vllm:generation_tokens_total",
	"vllm:prompt_tokens_total",
	"sglang:generation_tokens_total",
	"sglang:prompt_tokens_total",
	"llamacpp:tokens_predicted_total",
	"llamacpp:prompt_tokens_total",
	"llamacpp:n_decode_total",
	"tgi_batch_inference_count",
}

// Progress is the sum of the engine's progress counters (ok is false
// when it publishes none: a generic OpenAI-compatible server). Only its
// movement means anything: a value that changed since an earlier scrape
// of the same run is an engine that completed work in between.
func (u Uptime) Progress() (float64, bool) {
	var sum float64
	ok := false
	for _, name := range progressCounters {
		if v, has := u.Counters[name]; has {
			sum, ok = sum+v, true
		}
	}
	return sum, ok
}
