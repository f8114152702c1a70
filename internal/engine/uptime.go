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

// generatedTokenCounters are the counter families in which engines count
// the tokens they generated: a stalled engine's stay still.
var generatedTokenCounters = [...]string{
	"vllm:generation_tokens_total",
	"sglang:generation_tokens_total",
	"llamacpp:tokens_predicted_total",
}

// GeneratedTokens is the engine's count of generated tokens, summed over
// the families it publishes (ok is false when it publishes none: TGI
// counts them in a histogram updated only as requests end, which says
// nothing of a generation in progress).
func (u Uptime) GeneratedTokens() (float64, bool) {
	var sum float64
	ok := false
	for _, name := range generatedTokenCounters {
		if v, has := u.Counters[name]; has {
			sum, ok = sum+v, true
		}
	}
	return sum, ok
}
