package health

// DefaultBytesPerToken is the bytes of canonical text per engine token
// assumed until Config.BytesPerToken knows better: the English average.
const DefaultBytesPerToken = 4.0

// ratioFactor is how far (a factor, either way) a replica's learned bytes
// per token may move from the ratio its reported capacity is in before the
// capacity follows. A capacity the mesh is told starts the replica's
// summary anew (another size, another epoch): every prefix the router
// knew the replica holds is forgotten, and the next turns of every
// conversation there are placed as if cold. A summary sized within 1.5x
// of the cache it describes costs little (a somewhat higher or lower
// false-positive rate, an earlier or later rotation, both corrected by the
// engine's cached-token reports), so the capacity follows a ratio that is
// another tokenizer's (vLLM's 2-2.5 against the default 4), not one that
// differs by a chat template's share of a short prompt (llama.cpp's 4.5-4.8
// measured on Gemma 3, where a 20% band wiped a replica's summary
// mid-run and cost a fifth of the follow-ups' cache).
const ratioFactor = 1.5

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
