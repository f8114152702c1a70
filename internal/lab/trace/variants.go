package trace

import (
	"math/rand/v2"
	"time"
)

// WithoutSharedHead returns a copy of reqs with every leading block that
// all requests share removed, and input lengths shortened to match: the
// same conversations with no global system prompt. It tests that routing
// does not depend on one.
func WithoutSharedHead(reqs []Request) []Request {
	common := -1
	for _, r := range reqs {
		n := 0
		for n < len(r.HashIDs) && n < len(reqs[0].HashIDs) && r.HashIDs[n] == reqs[0].HashIDs[n] {
			n++
		}
		if common < 0 || n < common {
			common = n
		}
	}
	out := make([]Request, 0, len(reqs))
	for _, r := range reqs {
		if len(r.HashIDs) <= common {
			continue
		}
		r.HashIDs = r.HashIDs[common:]
		r.InputTokens = max(1, r.InputTokens-common*MooncakeBlockTokens)
		out = append(out, r)
	}
	return out
}

// HotPromptsConfig shapes a synthetic trace dominated by a few hot prompts.
type HotPromptsConfig struct {
	Requests     int           // total requests
	Rate         float64       // arrivals per second (Poisson)
	HotPrompts   int           // distinct hot prompts
	HotShare     float64       // share of requests that use a hot prompt
	PromptBlocks int           // blocks of each hot prompt
	SuffixBlocks int           // unique blocks after the prompt
	OutputTokens int           // per request
	Seed         uint64        // arrivals and choices
	Skew         float64       // Zipf exponent over the hot prompts (>1)
	Start        time.Duration // first arrival
}

// HotPrompts generates a trace in which most requests share one of a few
// long prompts (a document or a few-shot template) followed by a short
// unique question, with Zipf-skewed popularity: the case where
// longest-prefix routing collapses onto one replica.
func HotPrompts(c HotPromptsConfig) []Request {
	rng := rand.New(rand.NewPCG(c.Seed, c.Seed^0x5eed))
	zipf := rand.NewZipf(rng, max(c.Skew, 1.01), 1, uint64(max(c.HotPrompts, 1)-1))
	next := int64(1 << 40) // ids above any real trace's
	fresh := func() int64 { next++; return next }
	hot := make([][]int64, c.HotPrompts)
	for i := range hot {
		for b := 0; b < c.PromptBlocks; b++ {
			hot[i] = append(hot[i], fresh())
		}
	}
	out := make([]Request, 0, c.Requests)
	t := float64(c.Start) / float64(time.Millisecond)
	for i := 0; i < c.Requests; i++ {
		t += rng.ExpFloat64() / c.Rate * 1000
		var ids []int64
		if c.HotPrompts > 0 && rng.Float64() < c.HotShare {
			ids = append(ids, hot[zipf.Uint64()]...)
		} else {
			for b := 0; b < c.PromptBlocks; b++ {
				ids = append(ids, fresh())
			}
		}
		for b := 0; b < c.SuffixBlocks; b++ {
			ids = append(ids, fresh())
		}
		out = append(out, Request{
			Arrival:      time.Duration(t * float64(time.Millisecond)),
			InputTokens:  len(ids)*MooncakeBlockTokens - MooncakeBlockTokens/2,
			OutputTokens: c.OutputTokens,
			HashIDs:      ids,
		})
	}
	return out
}

// DefaultHotPrompts is the hot-prompt trace the simulator offers: 10,000
// requests, 90% of them on one of 64 prompts of 24 blocks (12k tokens)
// with Zipf popularity (the hottest takes about a quarter of them), each
// followed by a one-block question.
func DefaultHotPrompts() HotPromptsConfig {
	return HotPromptsConfig{Requests: 10000, Rate: 4, HotPrompts: 64, HotShare: 0.9, PromptBlocks: 24,
		SuffixBlocks: 1, OutputTokens: 200, Seed: 1, Skew: 1.1}
}
