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

// The cached tail. A summary knows a replica's prefix in whole blocks,
// but an engine holds its cache in its own units (llama.cpp to the token,
// vLLM in blocks of 16 or 32 tokens): the prefix it holds ends somewhere
// in the block after the match (the next block of the prompt, or the
// prompt's partial last one), where the previous turn's answer ended.
// Counting only whole blocks under-predicted by half a block a prompt,
// a tenth of a 5-block prompt's cached tokens on real llama.cpp and vLLM
// (issue 22). Each replica's share of that block held is learnt from its
// engine's reports on the prompts it held the match of, block-weighted,
// over the last few dozen; it starts at half (the end of a held prefix
// anywhere in the block, evenly) with the weight of one block.
const tailPrior = 0.5

// clampBytesPerToken bounds a ratio to what text of any tokenizer gives.
func clampBytesPerToken(r float64) float64 {
	return min(max(r, minBytesPerToken), maxBytesPerToken)
}

// TokenRatios learns the bytes of canonical prompt text per engine token
// of each replica and the share of the block after a match its engine
// holds (the file comment). It is safe for concurrent use, and a
// prometheus.Collector of kvmesh_replica_bytes_per_token and
// kvmesh_replica_cached_tail_share.
type TokenRatios struct {
	mu sync.Mutex
	by map[string]*tokenRatio
	// all is every replica's answers together: a request's estimate
	// before its replica is chosen (a tenant's token budget, tenants.go).
	all      tokenRatio
	desc     *prometheus.Desc
	tailDesc *prometheus.Desc
}

// tokenRatio is one replica's decayed sums and what it has seen in all.
type tokenRatio struct {
	bytes, tokens float64
	seen          int64
	// The cached tail's decayed sums, in blocks: held beyond the match,
	// and the room there was.
	tailHeld, tailRoom float64
}

func newTokenRatio() *tokenRatio { return &tokenRatio{tailHeld: tailPrior, tailRoom: 1} }

// NewTokenRatios returns ratios that know no replica yet.
func NewTokenRatios() *TokenRatios {
	return &TokenRatios{by: map[string]*tokenRatio{}, desc: prometheus.NewDesc("kvmesh_replica_bytes_per_token",
		"Bytes of the router's canonical prompt text per engine prompt token in use for each replica this router checks or had answers from: learned from its usage.prompt_tokens, 4 until it has reported 1000 prompt tokens.",
		[]string{"replica"}, nil),
		tailDesc: prometheus.NewDesc("kvmesh_replica_cached_tail_share",
			"Share of the block after a predicted match (the next block of the prompt, or its partial last one) that the replica's engine reports cached, learnt from its usage.prompt_tokens_details.cached_tokens, 0.5 until reported; the predicted cached tokens count it.",
			[]string{"replica"}, nil)}
}

// tailRoom is the bytes after match whole blocks of a prompt of n bytes
// in which the held prefix may end: the next block, or the partial last
// one. A prompt that matched nothing has none (it is cold, or shares
// less than a block, which the summary cannot tell).
func tailRoom(match, n, blockBytes int) int {
	if match < 1 {
		return 0
	}
	return max(min(blockBytes, n-match*blockBytes), 0)
}

// Predict returns the tokens of a prompt of n bytes, at bpt bytes per
// token, that replica's engine should report cached when its summary
// matched match blocks of blockBytes: the blocks, and the learnt share of
// the block after them.
func (t *TokenRatios) Predict(replica string, match, n, blockBytes int, bpt float64) float64 {
	held := float64(match * blockBytes)
	if room := tailRoom(match, n, blockBytes); room > 0 {
		t.mu.Lock()
		share := tailPrior
		if r := t.by[replica]; r != nil {
			share = r.share()
		}
		t.mu.Unlock()
		held += share * float64(room)
	}
	return held / bpt
}

// ObserveCached learns replica's cached tail from one answered prompt of
// n bytes at bpt bytes per token, of which its summary matched match
// blocks and its engine reported cached tokens cached. A report short of
// the match by a block or more is a miss, the correction's business: it
// tells nothing of where a held prefix ends.
func (t *TokenRatios) ObserveCached(replica string, match, n, blockBytes int, bpt float64, cached int64) {
	room := tailRoom(match, n, blockBytes)
	if room <= 0 || bpt <= 0 {
		return
	}
	bb := float64(blockBytes)
	held := float64(cached)*bpt - float64(match)*bb
	if held < -bb {
		return
	}
	// A little short of the match (an engine that counts in blocks of
	// its own ends before ours) counts, as far as a block.
	held = min(held, float64(room))
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.by[replica]
	if r == nil {
		r = newTokenRatio()
		t.by[replica] = r
	}
	r.tailHeld = r.tailHeld*(1-ratioDecay) + held/bb
	r.tailRoom = r.tailRoom*(1-ratioDecay) + float64(room)/bb
}

// share is the share of the block after a match the engine holds.
func (r *tokenRatio) share() float64 {
	return min(max(r.tailHeld/r.tailRoom, 0), 1)
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
		r = newTokenRatio()
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
		r = newTokenRatio()
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
func (t *TokenRatios) Describe(ch chan<- *prometheus.Desc) { ch <- t.desc; ch <- t.tailDesc }

// Collect is prometheus.Collector's: the ratio and tail share in use for
// each replica observed or asked about.
func (t *TokenRatios) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, r := range t.by {
		ch <- prometheus.MustNewConstMetric(t.desc, prometheus.GaugeValue, r.of(), id)
		ch <- prometheus.MustNewConstMetric(t.tailDesc, prometheus.GaugeValue, r.share(), id)
	}
}
