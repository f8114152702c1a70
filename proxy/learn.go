package proxy

import (
	"github.com/kvmesh/kvmesh/route"
)

// learn records what the replica holds after a complete response (prompt
// + answer) and checks the summary's prediction against the engine's
// report. The engine's cached tokens are the ground truth: the blocks the
// summary claimed beyond them are forgotten (the replica evicted them),
// and the prompt is recorded again after that, since the engine has just
// computed it.
func (st *reqState) learn(id string, d route.Decision, sink *answerSink) {
	p := st.p
	forgot := false
	if u := sink.usage; u.present {
		if u.promptTokens > 0 {
			p.m.promptTokens.Add(float64(u.promptTokens))
		}
		if u.hasCached {
			c := u.cachedTokens
			if c > 0 {
				p.m.reportedCached.Add(float64(c))
			}
			p.m.predictedCached.Add(float64(d.Match * p.cfg.Contract.BlockBytes / bytesPerToken))
			forgot = st.correct(id, d.Match, c, u.promptTokens)
		}
	}
	if len(sink.answer) == 0 && !forgot {
		return
	}
	// The text (prompt + answer) starts with the prompt, so the chain
	// continues from the prompt's last full block: only the prompt's
	// partial last block and the answer are rendered again.
	n, bb := len(st.hashes), p.cfg.Contract.BlockBytes
	from := st.root
	if n > 0 {
		from = st.hashes[n-1]
	}
	tail := st.prompt
	tail.Text = st.prompt.Text[n*bb:]
	all := p.cfg.Contract.AppendHashes(st.hashes[:n:n], from, tail.AppendAnswer(string(sink.answer)))
	if len(all) > n || forgot {
		p.cfg.View.Record(id, all)
	}
}

// forgetSlackBlocks is how many blocks past the reported cached tokens
// (when any are reported) are still taken as held: the engine counts
// chat-template tokens the canonical text does not have and rounds down to
// its own block size, so a correct prediction may exceed the report by a
// fraction of a block.
const forgetSlackBlocks = 1

// correct compares the predicted match (blocks) with the engine's
// reported cached tokens, observes the error, and forgets the blocks the
// summary claimed beyond the report. It reports whether it forgot any.
func (st *reqState) correct(id string, match int, cached, promptTokens int64) bool {
	p := st.p
	bb := float64(p.cfg.Contract.BlockBytes)
	// Convert tokens to canonical-text bytes with this request's own
	// ratio (its prompt's bytes over its reported tokens) when it is
	// sane, else the English average.
	bpt := float64(bytesPerToken)
	if promptTokens > 0 && len(st.prompt.Text) > 0 {
		bpt = min(max(float64(len(st.prompt.Text))/float64(promptTokens), 1), 8)
	}
	reported := float64(max(cached, 0)) * bpt / bb
	p.m.predictionError.Observe(float64(match) - reported)
	keep := 0 // nothing reported: nothing of the prefix is held
	if cached > 0 {
		keep = int(reported) + forgetSlackBlocks
	}
	match = min(match, len(st.hashes))
	if keep >= match {
		return false
	}
	p.cfg.View.Forget(id, st.hashes[keep:match])
	p.m.forgotten.Add(float64(match - keep))
	return true
}
