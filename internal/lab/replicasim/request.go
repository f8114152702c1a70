package replicasim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// endpoint says which OpenAI API a request body belongs to.
type endpoint int

const (
	chatEndpoint       endpoint = iota // POST /v1/chat/completions
	completionEndpoint                 // POST /v1/completions
	responsesEndpoint                  // POST /v1/responses (OpenAI Responses API)
	messagesEndpoint                   // POST /v1/messages (Anthropic Messages API)
)

// chatMessage is one message with its content flattened to text.
type chatMessage struct {
	Role    string
	Content string
}

// parsedRequest is what the engine needs from a request body.
type parsedRequest struct {
	Model        string
	Prompt       string // the rendered prompt text the engine tokenizes
	MaxTokens    int    // 0 when the request gives none
	Stream       bool
	IncludeUsage bool
	// PreviousResponseID (Responses) names a stored response whose
	// conversation precedes Prompt; Store says whether to store this one.
	PreviousResponseID string
	Store              bool
	// PD is what the body says of disaggregation (pd.go).
	PD pdFields
}

// wireRequest is the subset of the OpenAI request body the simulator reads;
// other fields (temperature, n, tools, ...) are accepted and ignored.
type wireRequest struct {
	Model               string          `json:"model"`
	Messages            []wireMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// AddGenerationPrompt is vLLM's chat field: false renders the
	// messages without opening an assistant turn.
	AddGenerationPrompt *bool `json:"add_generation_prompt"`
	// Responses API.
	Instructions       string          `json:"instructions"`
	Input              json.RawMessage `json:"input"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	PreviousResponseID string          `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	// Messages API (messages and max_tokens are shared with chat).
	System json.RawMessage `json:"system"`
	// Disaggregation (pd.go).
	pdFields
}

type wireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// errBadRequest marks parse errors that are the client's fault (400).
var errBadRequest = errors.New("bad request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

// parseRequest decodes an untrusted request body for the given endpoint and
// renders its prompt. Every error wraps errBadRequest.
func parseRequest(ep endpoint, body []byte) (parsedRequest, error) {
	var w wireRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&w); err != nil {
		return parsedRequest{}, badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return parsedRequest{}, badRequest("invalid JSON body: trailing data")
	}
	p := parsedRequest{Model: w.Model, Stream: w.Stream, PD: w.pdFields}
	if w.StreamOptions != nil {
		p.IncludeUsage = w.StreamOptions.IncludeUsage
	}
	// max_completion_tokens is the newer name; it wins when both are given.
	mt := w.MaxTokens
	if w.MaxCompletionTokens != nil {
		mt = w.MaxCompletionTokens
	}
	if ep == responsesEndpoint {
		mt = w.MaxOutputTokens
	}
	if mt != nil {
		if *mt < 1 {
			return parsedRequest{}, badRequest("max_tokens must be at least 1, got %d", *mt)
		}
		p.MaxTokens = *mt
	}
	switch ep {
	case chatEndpoint:
		if w.Messages == nil {
			return parsedRequest{}, badRequest("messages is required")
		}
		msgs := make([]chatMessage, len(w.Messages))
		for i, m := range w.Messages {
			if m.Role == "" {
				return parsedRequest{}, badRequest("messages[%d].role is required", i)
			}
			c, err := contentText(m.Content)
			if err != nil {
				return parsedRequest{}, badRequest("messages[%d].content: %v", i, err)
			}
			msgs[i] = chatMessage{Role: m.Role, Content: c}
		}
		p.Prompt = renderChat(msgs, w.AddGenerationPrompt == nil || *w.AddGenerationPrompt)
	case completionEndpoint:
		s, err := promptText(w.Prompt)
		if err != nil {
			return parsedRequest{}, badRequest("prompt: %v", err)
		}
		p.Prompt = s
	case responsesEndpoint:
		var msgs []chatMessage
		if w.Instructions != "" {
			msgs = append(msgs, chatMessage{Role: "system", Content: w.Instructions})
		}
		in, err := inputMessages(w.Input)
		if err != nil {
			return parsedRequest{}, badRequest("input: %v", err)
		}
		p.Prompt = renderChat(append(msgs, in...), true)
		p.PreviousResponseID = w.PreviousResponseID
		p.Store = w.Store == nil || *w.Store
	case messagesEndpoint:
		if len(w.Messages) == 0 {
			return parsedRequest{}, badRequest("messages: at least one message is required")
		}
		if mt == nil {
			return parsedRequest{}, badRequest("max_tokens: Field required")
		}
		var msgs []chatMessage
		if sys := bytes.TrimSpace(w.System); len(sys) > 0 && !bytes.Equal(sys, []byte("null")) {
			c, err := contentText(sys)
			if err != nil {
				return parsedRequest{}, badRequest("system: %v", err)
			}
			msgs = append(msgs, chatMessage{Role: "system", Content: c})
		}
		for i, m := range w.Messages {
			if m.Role != "user" && m.Role != "assistant" {
				return parsedRequest{}, badRequest("messages[%d].role must be user or assistant", i)
			}
			c, err := contentText(m.Content)
			if err != nil {
				return parsedRequest{}, badRequest("messages[%d].content: %v", i, err)
			}
			msgs = append(msgs, chatMessage{Role: m.Role, Content: c})
		}
		p.Prompt = renderChat(msgs, true)
	}
	return p, nil
}

// responseItem is one item of a Responses input array.
type responseItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// inputMessages flattens a Responses input (a string, or an array of
// items) into chat messages: function calls become assistant messages and
// their outputs tool messages, as vLLM's chat template sees them. Other
// item types (reasoning, references) are ignored.
func inputMessages(raw json.RawMessage) ([]chatMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, errors.New("is required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []chatMessage{{Role: "user", Content: s}}, nil
	}
	var items []responseItem
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errors.New("must be a string or an array of items")
	}
	var msgs []chatMessage
	for i, it := range items {
		switch {
		case it.Type == "message" || (it.Type == "" && it.Role != ""):
			if it.Role == "" {
				return nil, fmt.Errorf("[%d].role is required", i)
			}
			c, err := contentText(it.Content)
			if err != nil {
				return nil, fmt.Errorf("[%d].content: %v", i, err)
			}
			msgs = append(msgs, chatMessage{Role: it.Role, Content: c})
		case it.Type == "function_call":
			msgs = append(msgs, chatMessage{Role: "assistant", Content: it.Name + "(" + it.Arguments + ")"})
		case it.Type == "function_call_output":
			c, err := contentText(it.Output)
			if err != nil {
				return nil, fmt.Errorf("[%d].output: %v", i, err)
			}
			msgs = append(msgs, chatMessage{Role: "tool", Content: c})
		case it.Type == "":
			return nil, fmt.Errorf("[%d] has neither a type nor a role", i)
		}
	}
	return msgs, nil
}

// contentText flattens message content: a string, null, or an array of
// parts whose text parts are concatenated (other parts, such as images, are
// ignored).
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of content parts")
	}
	var b bytes.Buffer
	for _, pt := range parts {
		switch pt.Type {
		case "text", "", "input_text", "output_text":
			b.WriteString(pt.Text)
		}
	}
	return b.String(), nil
}

// promptText reads the completions prompt: a string, an array of strings (the
// first is used), or token IDs (an array of integers, or an array of such
// arrays, the first used). Token IDs become 4 bytes each so that the token
// count is exact under the 4-bytes-per-token approximation.
func promptText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", errors.New("is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil {
		if len(ss) == 0 {
			return "", errors.New("must not be empty")
		}
		return ss[0], nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		return idsText(ids), nil
	}
	var idss [][]uint32
	if err := json.Unmarshal(raw, &idss); err == nil {
		if len(idss) == 0 {
			return "", errors.New("must not be empty")
		}
		return idsText(idss[0]), nil
	}
	return "", errors.New("must be a string, an array of strings, or token IDs")
}

func idsText(ids []uint32) string {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], id)
	}
	return string(b)
}
