package proxy

import (
	"bytes"
	"encoding/json"
)

// maxAnswerBytes bounds what the owner keeps of a response to learn the
// generated answer: a longer answer is recorded up to this length (a prefix
// of what the engine holds is still true).
const maxAnswerBytes = 4 << 20

// maxSSELine bounds one pending SSE line; a longer line is skipped.
const maxSSELine = 1 << 20

// usage is the OpenAI usage object, as far as the router reads it.
type usage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// cached returns the reported cached prompt tokens, if any.
func (u *usage) cached() (int64, bool) {
	if u == nil || u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens == nil {
		return 0, false
	}
	return *u.PromptTokensDetails.CachedTokens, true
}

// completionBody is a non-streaming chat or completion response.
type completionBody struct {
	Choices []struct {
		Index   int `json:"index"`
		Message *struct {
			Content *string `json:"content"`
		} `json:"message"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// streamChunk is one SSE data event of a streaming response.
type streamChunk struct {
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Content *string `json:"content"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// answerSink watches the bytes of a response as they pass through to the
// client and collects the generated answer (choice 0) and the usage. It
// never changes or holds back the bytes.
type answerSink struct {
	sse    bool
	buf    []byte // SSE: the pending partial line; JSON: the body so far
	skip   bool   // SSE: drop the rest of an overlong line; JSON: body too large
	answer []byte
	usage  *usage
	done   bool // SSE: saw [DONE]
}

// feed takes the next bytes of the response body.
func (s *answerSink) feed(b []byte) {
	if !s.sse {
		if s.skip {
			return
		}
		if len(s.buf)+len(b) > maxAnswerBytes {
			s.skip, s.buf = true, nil
			return
		}
		s.buf = append(s.buf, b...)
		return
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if !s.skip {
				if len(s.buf)+len(b) > maxSSELine {
					s.skip, s.buf = true, s.buf[:0]
				} else {
					s.buf = append(s.buf, b...)
				}
			}
			return
		}
		line := b[:i]
		b = b[i+1:]
		if s.skip {
			s.skip = false
			continue
		}
		if len(s.buf) > 0 {
			s.buf = append(s.buf, line...)
			line = s.buf
		}
		s.line(line)
		s.buf = s.buf[:0]
	}
}

// line handles one complete SSE line.
func (s *answerSink) line(l []byte) {
	l = bytes.TrimSuffix(l, []byte{'\r'})
	data, ok := bytes.CutPrefix(l, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, []byte("[DONE]")) {
		s.done = true
		return
	}
	var c streamChunk
	if json.Unmarshal(data, &c) != nil {
		return
	}
	if c.Usage != nil {
		s.usage = c.Usage
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		text := ch.Text
		if ch.Delta != nil && ch.Delta.Content != nil {
			text = *ch.Delta.Content
		}
		s.appendAnswer(text)
	}
}

func (s *answerSink) appendAnswer(t string) {
	if room := maxAnswerBytes - len(s.answer); len(t) > room {
		t = t[:room]
	}
	s.answer = append(s.answer, t...)
}

// finish is called once the body has ended cleanly; it parses a JSON body.
func (s *answerSink) finish() {
	if s.sse {
		if len(s.buf) > 0 && !s.skip {
			s.line(s.buf)
		}
		return
	}
	if s.skip {
		return
	}
	var c completionBody
	if json.Unmarshal(s.buf, &c) != nil {
		return
	}
	s.usage = c.Usage
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		if ch.Message != nil && ch.Message.Content != nil {
			s.appendAnswer(*ch.Message.Content)
		} else {
			s.appendAnswer(ch.Text)
		}
	}
}
