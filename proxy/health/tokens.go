package health

// DefaultBytesPerToken is the bytes of canonical text per engine token
// assumed until Config.BytesPerToken knows better: the English average.
const DefaultBytesPerToken = 4.0

// ratioFactor is how far (a factor, either way) a replica's learned bytes
// per token may move from the ratio its reported capacity is in before the
// capacity follows. A new capacity resizes the replica's summary with what
// it holds (summary.Resized), but into a new epoch, which every other
// router takes as a full copy: following the drift of an average (the
// ratio is one over the last few dozen prompts) would send one every few
// requests. Within an eighth, the summary's window (it remembers 0.75 to
// 1.5 capacities, erring long on purpose) moves by less than its own
// width's slack, and the engine's cached-token reports correct it; a
// first learned ratio (llama.cpp's 4.5-4.8 on Gemma 3 against the default
// 4) or another tokenizer (vLLM's 2-2.5) is followed.
const ratioFactor = 1.125

// ratioLocked updates the ratio s's capacity is in; h.mu is held.
func (h *Checker) ratioLocked(id string, s *replicaHealth) {
	r := h.cfg.BytesPerToken(id)
	if r <= 0 {
		r = DefaultBytesPerToken
	}
	if old := s.bytesPerToken; old <= 0 || r > old*ratioFactor || r < old/ratioFactor {
		s.bytesPerToken = r
	}
}
