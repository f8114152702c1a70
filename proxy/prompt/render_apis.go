package prompt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// This file renders the two newer request formats, OpenAI's Responses API
// and Anthropic's Messages API, into the same canonical text as chat: a
// record per message (role, optional id, content), tool definitions first,
// a tool call as a call group inside the assistant record, a tool result as
// a "tool" record. A conversation carried on in one format therefore
// prefix-matches its earlier turns the way a chat conversation does, and a
// Responses or Messages answer is appended exactly like a chat answer
// (Prompt.AppendAnswer with Chat set).
//
// They are written with encoding/json only: the single-pass scanner pays
// for itself on chat and completion bodies, the bulk of the traffic
// (docs/BENCHMARKS.md, "Request-side JSON"), and a second hand-written
// scanner for these formats is not worth its upkeep.

// clientKeys are the fields a body may carry for the router beyond the
// prompt: routing keys, and vLLM's scheduling priority.
type clientKeys struct {
	PromptCacheKey string          `json:"prompt_cache_key"`
	BootstrapRoom  json.RawMessage `json:"bootstrap_room"`
	Priority       json.RawMessage `json:"priority"`
	// The output cap, by its name in each API: chat's
	// max_completion_tokens (and its older max_tokens), completions' and
	// Messages' max_tokens, Responses' max_output_tokens.
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxOutputTokens     json.RawMessage `json:"max_output_tokens"`
}

// apply copies the keys into p. bootstrap_room and priority are kept as
// their compact JSON text (SGLang sends an integer; a batch sends an
// array).
func (k clientKeys) apply(p *Prompt) {
	p.CacheKey = k.PromptCacheKey
	if room := bytes.TrimSpace(k.BootstrapRoom); len(room) > 0 && !bytes.Equal(room, []byte("null")) {
		p.BootstrapRoom = string(appendCompactJSON(nil, room))
	}
	if pr := bytes.TrimSpace(k.Priority); len(pr) > 0 && !bytes.Equal(pr, []byte("null")) {
		p.Priority = string(appendCompactJSON(nil, pr))
	}
	p.MaxTokens = firstCap(capOf(k.MaxCompletionTokens), capOf(k.MaxTokens), capOf(k.MaxOutputTokens))
}

// capOf reads an output cap: a non-negative integer, else 0 (none).
func capOf(raw json.RawMessage) int64 {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// firstCap is the first cap given (non-zero), in the order of
// precedence: max_completion_tokens, max_tokens, max_output_tokens.
func firstCap(caps ...int64) int64 {
	for _, c := range caps {
		if c > 0 {
			return c
		}
	}
	return 0
}

type responsesRequest struct {
	Model              string            `json:"model"`
	Instructions       *string           `json:"instructions"`
	Input              json.RawMessage   `json:"input"`
	Tools              []json.RawMessage `json:"tools"`
	Stream             bool              `json:"stream"`
	PreviousResponseID string            `json:"previous_response_id"`
	CacheSalt          string            `json:"cache_salt"`
	clientKeys
}

// responseItem is one item of a Responses input array, as far as the
// rendering reads it. Items of other types are rendered as a digest.
type responseItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// RenderResponses parses a POST /v1/responses body and renders its prompt
// as chat would render the same conversation: tools, then instructions as
// a system message, then the input (a string is one user message; an array
// is items in order: messages, function calls, function call outputs).
// A turn that sends the earlier turns' items and output back as input
// renders to text that starts with the earlier turn's prompt and answer.
//
// A request with previous_response_id renders only what it sends; the
// router keeps such a conversation on its replica by the response id.
func RenderResponses(body []byte) (Prompt, error) {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return Prompt{}, fmt.Errorf("%w: body is not a valid Responses request: %v", ErrBadRequest, err)
	}
	if req.Model == "" {
		return Prompt{}, fmt.Errorf("%w: 'model' is required", ErrBadRequest)
	}
	p := Prompt{Model: req.Model, CacheSalt: req.CacheSalt, Stream: req.Stream, Chat: true,
		PreviousResponseID: req.PreviousResponseID}
	req.clientKeys.apply(&p)
	text := make([]byte, 0, len(body)+64)
	text = appendTools(text, req.Tools)
	if req.Instructions != nil && *req.Instructions != "" {
		text = appendMessage(text, "system", "", []byte(*req.Instructions))
	}
	input := bytes.TrimSpace(req.Input)
	switch {
	case len(input) == 0 || bytes.Equal(input, []byte("null")):
		return Prompt{}, fmt.Errorf("%w: 'input' is required", ErrBadRequest)
	case input[0] == '"':
		var s rawText
		if err := s.UnmarshalJSON(input); err != nil {
			return Prompt{}, fmt.Errorf("%w: 'input': %v", ErrBadRequest, err)
		}
		text = appendMessage(text, "user", "", s)
	case input[0] == '[':
		var items []json.RawMessage
		if err := json.Unmarshal(input, &items); err != nil {
			return Prompt{}, fmt.Errorf("%w: 'input': %v", ErrBadRequest, err)
		}
		var err error
		if text, err = appendResponseItems(text, items); err != nil {
			return Prompt{}, fmt.Errorf("%w: %v", ErrBadRequest, err)
		}
	default:
		return Prompt{}, fmt.Errorf("%w: 'input' must be a string or an array of items", ErrBadRequest)
	}
	p.Text = text
	return p, nil
}

func appendResponseItems(text []byte, items []json.RawMessage) ([]byte, error) {
	// lastRole is the role of the record text ends in, so that function
	// calls join the assistant record before them as chat's tool_calls do.
	lastRole := ""
	for i, raw := range items {
		var it responseItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return nil, fmt.Errorf("input[%d]: %v", i, err)
		}
		switch {
		case it.Type == "message" || (it.Type == "" && it.Role != ""):
			if it.Role == "" {
				return nil, fmt.Errorf("input[%d].role is required", i)
			}
			var err error
			text = appendMessage(text, it.Role, "", nil)
			if text, err = appendContent(text, it.Content, responsesContent); err != nil {
				return nil, fmt.Errorf("input[%d].content: %v", i, err)
			}
			lastRole = it.Role
		case it.Type == "function_call":
			if lastRole != "assistant" {
				text = appendMessage(text, "assistant", "", nil)
				lastRole = "assistant"
			}
			text = appendCall(text, it.CallID, it.Name, it.Arguments)
		case it.Type == "function_call_output":
			text = appendMessage(text, "tool", it.CallID, nil)
			var err error
			if text, err = appendContent(text, it.Output, responsesContent); err != nil {
				return nil, fmt.Errorf("input[%d].output: %v", i, err)
			}
			lastRole = "tool"
		case it.Type == "":
			return nil, fmt.Errorf("input[%d] has neither a type nor a role", i)
		default:
			// reasoning, item_reference, built-in tool calls: the item
			// itself, by digest, in its own record.
			text = append(text, recordSep)
			text = append(text, it.Type...)
			text = append(text, unitSep)
			text = appendDigest(text, raw)
			lastRole = ""
		}
	}
	return text, nil
}

type messagesRequest struct {
	Model     string            `json:"model"`
	System    json.RawMessage   `json:"system"`
	Messages  []anthropicMsg    `json:"messages"`
	Tools     []json.RawMessage `json:"tools"`
	Stream    bool              `json:"stream"`
	CacheSalt string            `json:"cache_salt"`
	clientKeys
}

type anthropicMsg struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// RenderMessages parses an Anthropic-style POST /v1/messages body and
// renders it as chat would: tools, the system prompt as a system message,
// then the messages. Text blocks are text; a tool_use block is a call group
// (its input as compact JSON) and a tool_result block a result group inside
// the message that carries it; other blocks (images, documents, thinking)
// are digests.
func RenderMessages(body []byte) (Prompt, error) {
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return Prompt{}, fmt.Errorf("%w: body is not a valid Messages request: %v", ErrBadRequest, err)
	}
	if req.Model == "" {
		return Prompt{}, fmt.Errorf("%w: 'model' is required", ErrBadRequest)
	}
	if len(req.Messages) == 0 {
		return Prompt{}, fmt.Errorf("%w: 'messages' must be a non-empty array", ErrBadRequest)
	}
	p := Prompt{Model: req.Model, CacheSalt: req.CacheSalt, Stream: req.Stream, Chat: true}
	req.clientKeys.apply(&p)
	text := make([]byte, 0, len(body)+64)
	text = appendTools(text, req.Tools)
	if sys := bytes.TrimSpace(req.System); len(sys) > 0 && !bytes.Equal(sys, []byte("null")) {
		text = appendMessage(text, "system", "", nil)
		var err error
		if text, err = appendContent(text, sys, messagesContent); err != nil {
			return Prompt{}, fmt.Errorf("%w: 'system': %v", ErrBadRequest, err)
		}
	}
	for i, m := range req.Messages {
		if m.Role == "" {
			return Prompt{}, fmt.Errorf("%w: messages[%d].role is required", ErrBadRequest, i)
		}
		text = appendMessage(text, m.Role, "", nil)
		var err error
		if text, err = appendContent(text, m.Content, messagesContent); err != nil {
			return Prompt{}, fmt.Errorf("%w: messages[%d].content: %v", ErrBadRequest, i, err)
		}
	}
	p.Text = text
	return p, nil
}

// appendTools renders tool definitions as chat does: each as its compact
// JSON in a "tool" record.
func appendTools(text []byte, tools []json.RawMessage) []byte {
	for _, t := range tools {
		text = append(text, recordSep)
		text = append(text, "tool"...)
		text = append(text, unitSep)
		text = appendCompactJSON(text, t)
	}
	return text
}

// appendCall renders one tool call as chat renders a tool_calls entry.
func appendCall(text []byte, id, name, args string) []byte {
	text = append(text, groupSep)
	text = append(text, "call"...)
	text = append(text, unitSep)
	text = append(text, id...)
	text = append(text, unitSep)
	text = append(text, name...)
	text = append(text, unitSep)
	return append(text, args...)
}

type embeddingsRequest struct {
	Model string `json:"model"`
	clientKeys
}

// RenderEmbeddings parses a POST /v1/embeddings body for what routing
// needs: the model and any client keys. Embeddings are placed by load, not
// by prefix, so the prompt text stays empty.
func RenderEmbeddings(body []byte) (Prompt, error) {
	var req embeddingsRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return Prompt{}, fmt.Errorf("%w: body is not a valid embeddings request: %v", ErrBadRequest, err)
	}
	if req.Model == "" {
		return Prompt{}, fmt.Errorf("%w: 'model' is required", ErrBadRequest)
	}
	p := Prompt{Model: req.Model}
	req.clientKeys.apply(&p)
	return p, nil
}
