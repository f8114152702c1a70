package proxy

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Bytes per token: the router measures prompts in bytes of canonical text
// (summary blocks), the engines in tokens of their own tokenizer. English
// text averages about 4 bytes per token, but an engine counts its chat
// template's tokens too, and tokenizers differ: real vLLM engines counted
// 2 to 2.5 bytes per token of the router's text (issue 22). Each replica's
// ratio is learned from its own answers, usage.prompt_tokens against the
// bytes of the prompt the router rendered, and used wherever tokens and
// blocks meet: the predicted cached tokens, the correction's reading of
// the reported ones (each prompt's own ratio first, when it has one), and
// the conversion of the engine's cache size into summary blocks
// (health.Config.BytesPerToken).
const (
	// DefaultBytesPerToken is the ratio until a replica's is learned.
	DefaultBytesPerToken = 4.0
	minBytesPerToken     = 1.0
	maxBytesPerToken     = 8.0
	// learnTokens is how many prompt tokens a replica's ratio needs
	// before it replaces the default: a few prompts' worth, so that a
	// short first prompt, whose template tokens weigh most, does not
	// decide it.
	learnTokens = 1000
	// ratioDecay is the weight each new prompt's bytes and tokens take
	// off the sums before it: an average over the last few dozen prompts,
	// weighted by their tokens.
	ratioDecay = 1.0 / 32
)

// clampBytesPerToken bounds a ratio to what text of any tokenizer gives.
func clampBytesPerToken(r float64) float64 {
	return min(max(r, minBytesPerToken), maxBytesPerToken)
}

// TokenRatios learns the bytes of canonical prompt text per engine token
// of each replica (the file comment). It is safe for concurrent use, and
// a prometheus.Collector of kvmesh_replica_bytes_per_token.
type TokenRatios struct {
	mu sync.Mutex
	by map[string]*tokenRatio
	// all is every replica's answers together: a request's estimate
	// before its replica is chosen (a tenant's token budget, tenants.go).
	all  tokenRatio
	desc *prometheus.Desc
}

// tokenRatio is one replica's decayed sums and what it has seen in all.
type tokenRatio struct {
	bytes, tokens float64
	seen          int64
}

// NewTokenRatios returns ratios that know no replica yet.
func NewTokenRatios() *TokenRatios {
	return &TokenRatios{by: map[string]*tokenRatio{}, desc: prometheus.NewDesc("kvmesh_replica_bytes_per_token",
		"Bytes of the router's canonical prompt text per engine prompt token in use for each replica this router checks or had answers from: learned from its usage.prompt_tokens, 4 until it has reported 1000 prompt tokens.",
		[]string{"replica"}, nil)}
}

// Observe adds one answered prompt of replica: its canonical text's bytes
// and the prompt tokens the engine reported.
func (t *TokenRatios) Observe(replica string, bytes int, tokens int64) {
	if bytes <= 0 || tokens <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.by[replica]
	if r == nil {
		r = &tokenRatio{}
		t.by[replica] = r
	}
	r.add(bytes, tokens)
	t.all.add(bytes, tokens)
}

func (r *tokenRatio) add(bytes int, tokens int64) {
	r.bytes = r.bytes*(1-ratioDecay) + float64(bytes)
	r.tokens = r.tokens*(1-ratioDecay) + float64(tokens)
	r.seen += tokens
}

// Overall returns the ratio learned from every replica's answers, or
// DefaultBytesPerToken until they reported learnTokens prompt tokens.
func (t *TokenRatios) Overall() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.all.of()
}

// Of returns replica's learned ratio, or DefaultBytesPerToken until it
// has seen learnTokens prompt tokens. A replica asked about shows on the
// metric from then on, with the ratio in use.
func (t *TokenRatios) Of(replica string) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.by[replica]
	if r == nil {
		r = &tokenRatio{}
		t.by[replica] = r
	}
	return r.of()
}

// of is the ratio in use: learned, or the default until learnTokens.
func (r *tokenRatio) of() float64 {
	if r.seen < learnTokens {
		return DefaultBytesPerToken
	}
	return clampBytesPerToken(r.bytes / r.tokens)
}

// Describe is prometheus.Collector's.
func (t *TokenRatios) Describe(ch chan<- *prometheus.Desc) { ch <- t.desc }

// Collect is prometheus.Collector's: the ratio in use for each replica
// observed or asked about.
func (t *TokenRatios) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, r := range t.by {
		ch <- prometheus.MustNewConstMetric(t.desc, prometheus.GaugeValue, r.of(), id)
	}
}
