package replicasim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/zeebo/xxh3"
)

// This file writes the Responses API (as vLLM serves it, with OpenAI's
// event stream), the Anthropic Messages API and embeddings.

// responsesUsage is the Responses API usage object.
type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type outputMessage struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

// responseObject is a Responses API response.
type responseObject struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"`
	Model              string            `json:"model"`
	Output             []outputMessage   `json:"output"`
	Usage              *responsesUsage   `json:"usage"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Instructions       any               `json:"instructions"`
	Error              any               `json:"error"`
	IncompleteDetails  any               `json:"incomplete_details"`
	Metadata           map[string]string `json:"metadata"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	ToolChoice         string            `json:"tool_choice"`
	Tools              []any             `json:"tools"`
	Temperature        float64           `json:"temperature"`
	TopP               float64           `json:"top_p"`
	MaxOutputTokens    int               `json:"max_output_tokens"`
	Store              bool              `json:"store"`
	Truncation         string            `json:"truncation"`
	Text               map[string]any    `json:"text"`
}

func (o *output) responseObject(status string, answer *string) responseObject {
	r := responseObject{
		ID: o.seq.id, Object: "response", CreatedAt: o.seq.created, Status: status, Model: o.seq.req.Model,
		Output: []outputMessage{}, Metadata: map[string]string{}, ParallelToolCalls: true, ToolChoice: "auto",
		Tools: []any{}, Temperature: 1, TopP: 1, MaxOutputTokens: o.seq.maxTokens, Store: o.seq.req.Store,
		Truncation: "disabled", Text: map[string]any{"format": map[string]string{"type": "text"}},
	}
	if id := o.seq.req.PreviousResponseID; id != "" {
		r.PreviousResponseID = &id
	}
	if answer != nil {
		r.Output = append(r.Output, o.message("completed", *answer))
		u := responsesUsage{InputTokens: o.u.PromptTokens, OutputTokens: o.u.CompletionTokens, TotalTokens: o.u.TotalTokens}
		u.InputTokensDetails.CachedTokens = o.u.PromptTokensDetails.CachedTokens
		r.Usage = &u
	}
	return r
}

func (o *output) message(status, text string) outputMessage {
	m := outputMessage{ID: o.itemID(), Type: "message", Status: status, Role: "assistant", Content: []outputText{}}
	if status == "completed" {
		m.Content = append(m.Content, outputText{Type: "output_text", Text: text, Annotations: []any{}})
	}
	return m
}

// itemID is the id of the response's one output message.
func (o *output) itemID() string {
	return "msg_" + strings.TrimPrefix(o.seq.id, "resp_")
}

// namedEvent writes one SSE event with an event: line, as the Responses
// and Messages streams have. Responses events carry a sequence number.
func (o *output) namedEvent(typ string, fields map[string]any) {
	fields["type"] = typ
	if o.seq.ep == responsesEndpoint {
		fields["sequence_number"] = o.events
		o.events++
	}
	b, _ := json.Marshal(fields) // plain values: cannot fail
	fmt.Fprintf(&o.buf, "event: %s\ndata: %s\n\n", typ, b)
}

func (o *output) responsesStart() {
	o.namedEvent("response.created", map[string]any{"response": o.responseObject("in_progress", nil)})
	o.namedEvent("response.in_progress", map[string]any{"response": o.responseObject("in_progress", nil)})
	o.namedEvent("response.output_item.added", map[string]any{"output_index": 0, "item": o.message("in_progress", "")})
	o.namedEvent("response.content_part.added", map[string]any{"item_id": o.itemID(), "output_index": 0, "content_index": 0,
		"part": outputText{Type: "output_text", Annotations: []any{}}})
}

func (o *output) responsesToken(tok string) {
	o.namedEvent("response.output_text.delta", map[string]any{"item_id": o.itemID(), "output_index": 0, "content_index": 0,
		"delta": tok, "logprobs": []any{}})
}

func (o *output) responsesFinish(answer string, u usage) {
	o.u = u
	final := o.responseObject("completed", &answer)
	if o.store != nil {
		o.store(final)
	}
	if !o.seq.req.Stream {
		writeJSON(o.w, http.StatusOK, final)
		return
	}
	part := outputText{Type: "output_text", Text: answer, Annotations: []any{}}
	o.namedEvent("response.output_text.done", map[string]any{"item_id": o.itemID(), "output_index": 0, "content_index": 0,
		"text": answer, "logprobs": []any{}})
	o.namedEvent("response.content_part.done", map[string]any{"item_id": o.itemID(), "output_index": 0, "content_index": 0, "part": part})
	o.namedEvent("response.output_item.done", map[string]any{"output_index": 0, "item": o.message("completed", answer)})
	o.namedEvent("response.completed", map[string]any{"response": final})
	_ = o.flush()
}

// anthropicUsage is the Messages API usage: input_tokens counts only the
// prompt tokens not read from the cache, as Anthropic's API does.
type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicMessage struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []anthropicText `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        anthropicUsage  `json:"usage"`
}

var stopMaxTokens = "max_tokens"

func (o *output) anthropicUsage(outputTokens int) anthropicUsage {
	cached := o.u.PromptTokensDetails.CachedTokens
	return anthropicUsage{InputTokens: o.u.PromptTokens - cached, OutputTokens: outputTokens, CacheReadInputTokens: cached}
}

func (o *output) messagesStart() {
	m := anthropicMessage{ID: o.seq.id, Type: "message", Role: "assistant", Model: o.seq.req.Model,
		Content: []anthropicText{}, Usage: o.anthropicUsage(0)}
	o.namedEvent("message_start", map[string]any{"message": m})
	o.namedEvent("content_block_start", map[string]any{"index": 0, "content_block": anthropicText{Type: "text"}})
	o.namedEvent("ping", map[string]any{})
}

func (o *output) messagesToken(tok string) {
	o.namedEvent("content_block_delta", map[string]any{"index": 0, "delta": map[string]string{"type": "text_delta", "text": tok}})
}

func (o *output) messagesFinish(answer string, u usage) {
	o.u = u
	if !o.seq.req.Stream {
		writeJSON(o.w, http.StatusOK, anthropicMessage{ID: o.seq.id, Type: "message", Role: "assistant", Model: o.seq.req.Model,
			Content: []anthropicText{{Type: "text", Text: answer}}, StopReason: &stopMaxTokens, Usage: o.anthropicUsage(u.CompletionTokens)})
		return
	}
	o.namedEvent("content_block_stop", map[string]any{"index": 0})
	o.namedEvent("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stopMaxTokens, "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": u.CompletionTokens}})
	o.namedEvent("message_stop", map[string]any{})
	_ = o.flush()
}

// embeddingDims is the length of a simulated embedding unless the request
// asks for another.
const embeddingDims = 32

type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

// serveEmbeddings answers POST /v1/embeddings at once (an embedding model
// has no decode and this simulator models no prefix cache for it) with
// deterministic unit vectors: equal inputs embed equally.
func (s *Server) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req embeddingsRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return
	}
	if req.Model != "" && req.Model != s.cfg.Model {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	dims := embeddingDims
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > 4096 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("dimensions must be in [1, 4096], got %d", *req.Dimensions))
			return
		}
		dims = *req.Dimensions
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("encoding_format must be float or base64, got %q", req.EncodingFormat))
		return
	}
	inputs, err := embeddingInputs(req.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("input: %v", err))
		return
	}
	data := make([]map[string]any, len(inputs))
	tokens := 0
	for i, in := range inputs {
		tokens += countTokens(in)
		vec := embed(in, dims)
		var e any = vec
		if req.EncodingFormat == "base64" {
			b := make([]byte, 4*dims)
			for j, v := range vec {
				binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(v))
			}
			e = base64.StdEncoding.EncodeToString(b)
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": e}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data, "model": s.cfg.Model,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens}})
}

// embeddingInputs reads an embeddings input: a string, strings, token ids
// or lists of token ids (ids become 4 bytes each, as in completions).
func embeddingInputs(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	var s string
	if err := json.Unmarshal(raw, &s); err == nil && raw[0] == '"' {
		return []string{s}, nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil && len(ss) > 0 {
		return ss, nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil && len(ids) > 0 {
		return []string{idsText(ids)}, nil
	}
	var idss [][]uint32
	if err := json.Unmarshal(raw, &idss); err == nil && len(idss) > 0 {
		out := make([]string, len(idss))
		for i, x := range idss {
			out[i] = idsText(x)
		}
		return out, nil
	}
	return nil, fmt.Errorf("must be a non-empty string, array of strings, or token ids")
}

// embed returns a deterministic unit vector for text.
func embed(text string, dims int) []float32 {
	seed := xxh3.HashString(text)
	v := make([]float32, dims)
	var norm float64
	for i := range v {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(i))
		x := float64(xxh3.HashSeed(b[:], seed)>>11)/float64(1<<53)*2 - 1
		v[i] = float32(x)
		norm += x * x
	}
	norm = math.Sqrt(norm)
	if norm > 0 {
		for i := range v {
			v[i] = float32(float64(v[i]) / norm)
		}
	}
	return v
}
