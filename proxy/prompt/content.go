package prompt

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/zeebo/xxh3"
)

// contentForm is how one API's message content renders: which part types
// are text, whether Anthropic's tool blocks are read, and the words of its
// errors. Every API renders content with appendContent, so a text part,
// an image or a tool result frame the same way whichever API carried it.
type contentForm struct {
	// textTypes are the part types rendered as their text.
	textTypes []string
	// blocks reads parts as Anthropic content blocks: tool_use is a call
	// group, tool_result a result group holding its own content.
	blocks bool
	// part names one element of the array and shape says what the content
	// must be, in error messages.
	part, shape string
}

var (
	chatContent      = contentForm{textTypes: []string{"text"}, part: "part", shape: "must be a string, an array of content parts or null"}
	responsesContent = contentForm{textTypes: []string{"input_text", "output_text", "text"}, part: "part", shape: "must be a string, an array of content parts or null"}
	messagesContent  = contentForm{textTypes: []string{"text"}, blocks: true, part: "block", shape: "must be a string or an array of content blocks"}
)

// isText reports whether parts of type typ render as their text in f.
func isText[T string | []byte](f *contentForm, typ T) bool {
	for _, t := range f.textTypes {
		if string(typ) == t {
			return true
		}
	}
	return false
}

// contentPart is one element of a chat or Responses content array.
type contentPart struct {
	Type string  `json:"type"`
	Text rawText `json:"text"`
}

// anthropicBlock is one content block of an Anthropic message.
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      rawText         `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

// appendContent renders a message's content: null as nothing, a string as
// itself, an array part by part. Text parts are kept as text; any other
// part (image_url, input_audio, file, ...) is rendered as a digest of its
// JSON, so two images differ and one image repeated matches, without
// copying megabytes of base64 into the text. The chat scanner's content
// is the single-pass twin of this for chat, held to it by
// FuzzRenderMatchesReference.
func appendContent(dst []byte, raw json.RawMessage, f contentForm) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return dst, nil
	}
	switch raw[0] {
	case '"':
		var s rawText
		if err := s.UnmarshalJSON(raw); err != nil {
			return dst, err
		}
		return append(dst, s...), nil
	case '[':
	default:
		return dst, errors.New(f.shape)
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return dst, err
	}
	for i, pr := range parts {
		var b anthropicBlock
		var err error
		if f.blocks {
			err = json.Unmarshal(pr, &b)
		} else {
			var part contentPart
			err = json.Unmarshal(pr, &part)
			b.Type, b.Text = part.Type, part.Text
		}
		if err != nil {
			return dst, fmt.Errorf("%s %d: %v", f.part, i, err)
		}
		switch {
		case isText(&f, b.Type):
			dst = append(dst, b.Text...)
		case f.blocks && b.Type == "tool_use":
			dst = appendCall(dst, b.ID, b.Name, string(appendCompactJSON(nil, b.Input)))
		case f.blocks && b.Type == "tool_result":
			dst = append(dst, groupSep)
			dst = append(dst, "result"...)
			dst = append(dst, unitSep)
			dst = append(dst, b.ToolUseID...)
			dst = append(dst, unitSep)
			if dst, err = appendContent(dst, b.Content, f); err != nil {
				return dst, fmt.Errorf("%s %d: %v", f.part, i, err)
			}
		default:
			dst = appendPartDigest(dst, b.Type, pr)
		}
	}
	return dst, nil
}

// appendPartDigest renders a part that is not text: its type and the
// digest of its JSON, in a group.
func appendPartDigest[T string | []byte](dst []byte, typ T, raw []byte) []byte {
	dst = append(dst, groupSep)
	dst = append(dst, typ...)
	dst = append(dst, unitSep)
	return appendDigest(dst, raw)
}

// appendDigest appends the digest of raw's compact JSON, so that spacing
// does not change it.
func appendDigest(dst []byte, raw []byte) []byte {
	var c bytes.Buffer
	if json.Compact(&c, raw) == nil {
		raw = c.Bytes()
	}
	d := xxh3.Hash128(raw).Bytes()
	return hex.AppendEncode(dst, d[:])
}

func appendCompactJSON(dst []byte, raw []byte) []byte {
	var c bytes.Buffer
	if err := json.Compact(&c, raw); err != nil {
		return append(dst, raw...)
	}
	return append(dst, c.Bytes()...)
}

// rawText is a JSON string decoded without a second validation pass.
type rawText []byte

// UnmarshalJSON implements json.Unmarshaler. The decoder has already
// validated data as a JSON string, so it is unquoted in one pass; only
// invalid UTF-8 (which encoding/json replaces) takes the slow path.
func (t *rawText) UnmarshalJSON(data []byte) error {
	if len(data) >= 2 && data[0] == '"' && utf8.Valid(data) {
		if out, ok := jsonscan.AppendDecoded((*t)[:0], data[1:len(data)-1]); ok {
			*t = out
			return nil
		}
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	*t = append((*t)[:0], s...)
	return nil
}
