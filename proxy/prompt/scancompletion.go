package prompt

import (
	"encoding/binary"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

var completionTopFields = []string{"model", "prompt", "stream", "stream_options", "cache_salt", "prompt_cache_key", "bootstrap_room", "priority", "max_completion_tokens", "max_tokens", "max_output_tokens"}

// scanCompletion is RenderCompletion's fast path; ok=false means "ask
// renderCompletionStd".
func scanCompletion(body []byte) (Prompt, bool) {
	s := scanner{jsonscan.New(body, maxScanDepth)}
	if !s.Eat('{') {
		return Prompt{}, false
	}
	var t topFields
	var seen uint32
	var text []byte
	for first := true; ; first = false {
		key, done, ok := s.member(first)
		if !ok {
			return Prompt{}, false
		}
		if done {
			break
		}
		handled, ok := s.common(key, &seen, &t)
		if handled {
			if !ok {
				return Prompt{}, false
			}
			continue
		}
		if string(key) == "prompt" {
			if !once(&seen, 1<<4) {
				return Prompt{}, false
			}
			if text, ok = s.prompt(); !ok {
				return Prompt{}, false
			}
			continue
		}
		if !s.unknown(key, 1, completionTopFields...) {
			return Prompt{}, false
		}
	}
	if !s.End() || len(t.model) == 0 || text == nil {
		return Prompt{}, false
	}
	return t.prompt(false, text), true
}

// prompt renders a completion prompt like renderPrompt: a string, the
// first string of a batch, token ids, or the first list of a batch of
// token ids. The result is never nil; every error is left to the reference.
func (s *scanner) prompt() ([]byte, bool) {
	switch s.Peek() {
	case '"':
		return s.AppendString(make([]byte, 0, 64))
	case '[':
		s.Next()
	default:
		return nil, false
	}
	var text []byte
	var ok bool
	switch s.Peek() {
	case '"':
		text, ok = s.AppendString(make([]byte, 0, 64))
	case '[':
		s.Next()
		text, ok = s.tokenIDs()
	default:
		// The whole array is the token ids.
		return s.tokenIDs()
	}
	if !ok {
		return nil, false
	}
	// The rest of the batch is validated but does not route.
	for {
		done, ok := s.Element(false)
		if !ok {
			return nil, false
		}
		if done {
			return text, true
		}
		if !s.Skip(2) {
			return nil, false
		}
	}
}

// tokenIDs renders an array of token ids whose '[' has been consumed.
func (s *scanner) tokenIDs() ([]byte, bool) {
	out := make([]byte, 0, 64)
	out = append(out, recordSep, 't')
	for first := true; ; first = false {
		done, ok := s.Element(first)
		if !ok || (done && first) {
			return nil, false
		}
		if done {
			return out, true
		}
		s.Peek()
		id, ok := s.Uint32()
		if !ok {
			return nil, false
		}
		out = binary.LittleEndian.AppendUint32(out, id)
	}
}
