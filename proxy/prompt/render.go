package prompt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrBadRequest marks a request body that cannot be routed; the proxy
// answers it with 400.
var ErrBadRequest = errors.New("invalid request")

// Prompt is what the router needs from an OpenAI request body.
type Prompt struct {
	// Model is the requested model name.
	Model string
	// CacheSalt is vLLM's cache_salt: requests with different salts never
	// share cache, so it scopes the hash chain like the model does.
	CacheSalt string
	// Stream reports "stream": true.
	Stream bool
	// IncludeUsage reports stream_options.include_usage.
	IncludeUsage bool
	// Text is the canonical rendering of the prompt. A later turn of a
	// conversation renders to text that starts with AppendAnswer of the
	// earlier turn.
	Text []byte
	// Chat reports a chat request (messages) rather than a completion.
	// Responses and Messages requests render as chat and set it too.
	Chat bool
	// CacheKey is the body's prompt_cache_key (OpenAI's routing hint for
	// requests that share a prefix), "" when absent.
	CacheKey string
	// BootstrapRoom is SGLang's bootstrap_room as compact JSON text (the
	// prefill/decode pairing of a disaggregated request), "" when absent.
	BootstrapRoom string
	// PreviousResponseID is a Responses request's previous_response_id:
	// its earlier turns are held by the engine that produced that response
	// and are not in Text.
	PreviousResponseID string
	// Priority is the body's priority (vLLM's scheduling priority: lower
	// is more urgent) as compact JSON text, "" when absent or null.
	Priority string
	// MaxTokens is the body's cap on output tokens (max_completion_tokens,
	// else max_tokens, else max_output_tokens), 0 when none: what a
	// tenant's output budget reserves until the answer's usage is known.
	MaxTokens int64
}

// AppendAnswer returns the canonical text of the prompt followed by the
// model's answer, which is what the engine holds after the response and
// what the next turn of the conversation starts with.
func (p Prompt) AppendAnswer(answer string) []byte {
	out := make([]byte, 0, len(p.Text)+len(answer)+16)
	out = append(out, p.Text...)
	if p.Chat {
		return appendMessage(out, "assistant", "", []byte(answer))
	}
	return append(out, answer...)
}

// The canonical rendering frames each piece with control bytes that JSON
// text content would have to escape, so framing cannot be forged by content
// and adjacent fields cannot run together.
const (
	recordSep = 0x1e // starts a message or tool
	unitSep   = 0x1f // separates fields within one
	groupSep  = 0x1d // starts a non-text content part or a tool call
)

func appendMessage(dst []byte, role, name string, content []byte) []byte {
	dst = append(dst, recordSep)
	dst = append(dst, role...)
	if name != "" {
		dst = append(dst, unitSep)
		dst = append(dst, name...)
	}
	dst = append(dst, unitSep)
	return append(dst, content...)
}

type chatRequest struct {
	Model         string            `json:"model"`
	Messages      []chatMessage     `json:"messages"`
	Tools         []json.RawMessage `json:"tools"`
	Stream        bool              `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	CacheSalt string `json:"cache_salt"`
	clientKeys
}

type chatMessage struct {
	Role       string         `json:"role"`
	Name       string         `json:"name"`
	Content    messageContent `json:"content"`
	ToolCalls  []toolCall     `json:"tool_calls"`
	ToolCallID string         `json:"tool_call_id"`
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// messageContent is a message's content rendered while the body is
// decoded. Prompts are mostly one long string, so decoding it once, without
// a json.RawMessage copy and a second parse, is most of the router's
// per-request CPU.
type messageContent struct{ text []byte }

// UnmarshalJSON implements json.Unmarshaler.
func (c *messageContent) UnmarshalJSON(data []byte) error {
	text, err := appendContent(nil, data, chatContent)
	c.text = text
	return err
}

// RenderChat parses a /v1/chat/completions body and renders its prompt:
// tool definitions first (engines render them before the messages), then
// every message in order. Messages are only appended, never rewritten, so
// messages[0..k] renders to a prefix of messages[0..k+1].
//
// The common shapes are parsed by a single-pass scanner (scanChat), which is
// several times faster than encoding/json; whatever it is not sure about
// (an error, an unusual key, invalid UTF-8, ...) is decided by
// renderChatStd, the encoding/json definition of the result.
func RenderChat(body []byte) (Prompt, error) {
	if p, ok := scanChat(body, nil); ok {
		return p, nil
	}
	return RenderChatStd(body)
}

// RenderChatTo is RenderChat rendering into buf's storage when it can
// hold a text as long as the body (a router lends it from a pool, so that
// an 8 KB prompt is not 8 KB of garbage per request): the Prompt's Text may
// then share buf's array, and buf must not be reused while the Prompt is
// in use. The result is RenderChat's.
func RenderChatTo(buf, body []byte) (Prompt, error) {
	if p, ok := scanChat(body, buf); ok {
		return p, nil
	}
	return RenderChatStd(body)
}

// RenderChatStd is RenderChat written with encoding/json alone. It is the
// reference: the single-pass scanner must agree with it on every body it
// accepts (FuzzRenderMatchesReference), and it decides every body the
// scanner declines. It is exported for the proxy's end-to-end benchmark,
// which weighs the scanner against it (docs/BENCHMARKS.md).
func RenderChatStd(body []byte) (Prompt, error) {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return Prompt{}, fmt.Errorf("%w: body is not a valid chat completion request: %v", ErrBadRequest, err)
	}
	if req.Model == "" {
		return Prompt{}, fmt.Errorf("%w: 'model' is required", ErrBadRequest)
	}
	if len(req.Messages) == 0 {
		return Prompt{}, fmt.Errorf("%w: 'messages' must be a non-empty array", ErrBadRequest)
	}
	p := Prompt{Model: req.Model, CacheSalt: req.CacheSalt, Stream: req.Stream, Chat: true}
	if req.StreamOptions != nil {
		p.IncludeUsage = req.StreamOptions.IncludeUsage
	}
	req.clientKeys.apply(&p)
	size := 0
	for _, m := range req.Messages {
		size += len(m.Content.text) + len(m.Role) + 16
	}
	text := make([]byte, 0, size)
	text = appendTools(text, req.Tools)
	for i, m := range req.Messages {
		if m.Role == "" {
			return Prompt{}, fmt.Errorf("%w: messages[%d].role is required", ErrBadRequest, i)
		}
		text = append(text, recordSep)
		text = append(text, m.Role...)
		if m.Name != "" {
			text = append(text, unitSep)
			text = append(text, m.Name...)
		}
		if m.ToolCallID != "" {
			text = append(text, unitSep)
			text = append(text, m.ToolCallID...)
		}
		text = append(text, unitSep)
		text = append(text, m.Content.text...)
		for _, c := range m.ToolCalls {
			text = appendCall(text, c.ID, c.Function.Name, c.Function.Arguments)
		}
	}
	p.Text = text
	return p, nil
}

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	CacheSalt string `json:"cache_salt"`
	clientKeys
}

// RenderCompletion parses a /v1/completions body. A string prompt renders
// as itself, so a prompt that extends an earlier prompt plus its completion
// matches it. Token-id prompts render as their ids (4 bytes each, after a
// marker, so they never collide with text). A batch (an array of prompts)
// is routed by its first prompt: one request goes to one replica.
//
// Like RenderChat, it takes the single-pass scanner when it can and
// renderCompletionStd otherwise.
func RenderCompletion(body []byte) (Prompt, error) {
	if p, ok := scanCompletion(body); ok {
		return p, nil
	}
	return renderCompletionStd(body)
}

// renderCompletionStd is RenderCompletion written with encoding/json, the
// reference for scanCompletion.
func renderCompletionStd(body []byte) (Prompt, error) {
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return Prompt{}, fmt.Errorf("%w: body is not a valid completion request: %v", ErrBadRequest, err)
	}
	if req.Model == "" {
		return Prompt{}, fmt.Errorf("%w: 'model' is required", ErrBadRequest)
	}
	p := Prompt{Model: req.Model, CacheSalt: req.CacheSalt, Stream: req.Stream}
	if req.StreamOptions != nil {
		p.IncludeUsage = req.StreamOptions.IncludeUsage
	}
	req.clientKeys.apply(&p)
	text, err := renderPrompt(req.Prompt, true)
	if err != nil {
		return Prompt{}, fmt.Errorf("%w: 'prompt': %v", ErrBadRequest, err)
	}
	p.Text = text
	return p, nil
}

func renderPrompt(raw json.RawMessage, top bool) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, errors.New("is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []byte(s), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return nil, errors.New("must not be empty")
		}
		first := bytes.TrimSpace(items[0])
		if len(first) > 0 && (first[0] == '"' || first[0] == '[') {
			if !top {
				return nil, errors.New("nested too deeply")
			}
			return renderPrompt(items[0], false)
		}
		var ids []int64
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, errors.New("must be a string, an array of strings, or an array of token ids")
		}
		out := make([]byte, 0, 2+4*len(ids))
		out = append(out, recordSep, 't')
		for _, id := range ids {
			if id < 0 || id > 1<<32-1 {
				return nil, fmt.Errorf("token id %d out of range", id)
			}
			out = binary.LittleEndian.AppendUint32(out, uint32(id))
		}
		return out, nil
	default:
		return nil, errors.New("must be a string, an array of strings, or an array of token ids")
	}
}
