package bench

import (
	"math"
	"math/rand/v2"
)

// answerStream keys the random stream of answer lengths apart from the
// text's streams (which use PCG(seed, 0) and PCG(seed, conversation+1)),
// so drawing lengths changes no prompt.
const answerStream = 0x616e737765724c6e // "answerLn"

// answerTokens is the max_tokens of turn t (from 0) of conversation c:
// AnswerTokens when AnswerSigma is 0, else drawn lognormal with median
// AnswerTokens and log-space deviation AnswerSigma, clamped to
// [1, 16 × AnswerTokens]. Heavy-tailed answers are what make one engine
// queue wait behind a long answer while another replica's slot frees.
// The draw depends only on the seed, the conversation and the turn, so
// every front end of a run and every run of one seed asks for the same
// lengths, whatever order the clients happen to send them in.
func answerTokens(cfg ConvConfig, c, t int) int {
	m := cfg.AnswerTokens
	if cfg.AnswerSigma <= 0 {
		return m
	}
	r := rand.New(rand.NewPCG(cfg.Seed^answerStream, uint64(c)<<32|uint64(uint32(t))))
	v := float64(m) * math.Exp(cfg.AnswerSigma*r.NormFloat64())
	return int(min(max(math.Round(v), 1), float64(16*m)))
}
