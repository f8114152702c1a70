package replicasim

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// usage is the OpenAI usage object, with vLLM's cached-token detail.
type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *tokenDetails `json:"prompt_tokens_details"`
}

type tokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int        `json:"index"`
	Message      *chatMsg   `json:"message,omitempty"`
	Delta        *chatDelta `json:"delta,omitempty"`
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

type textChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

// response is a completion, chat completion, or one chunk of either.
type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
	// KVTransferParams: a vLLM prefill's (pd.go).
	KVTransferParams *kvParams `json:"kv_transfer_params,omitempty"`
}

// output writes a sequence's tokens to the client: SSE chunks as they come
// when streaming, one JSON body at the end otherwise.
type output struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	seq     *sequence
	started bool
	buf     bytes.Buffer
	events  int   // Responses: the next sequence_number
	u       usage // the usage so far (prompt and cached tokens from the start)
	// store keeps the final Responses object before the client sees it
	// (nil: not stored).
	store func(responseObject)
	// kv is a vLLM prefill's kv_transfer_params (nil: none).
	kv *kvParams
}

func newOutput(w http.ResponseWriter, seq *sequence) *output {
	return &output{w: w, rc: http.NewResponseController(w), seq: seq}
}

var finishLength = "length"

func (o *output) base(object string) response {
	return response{ID: o.seq.id, Object: object, Created: o.seq.created, Model: o.seq.req.Model}
}

// token emits one generated token; last marks the final one.
func (o *output) token(tok string, last bool) error {
	if !o.seq.req.Stream {
		return nil
	}
	var finish *string
	if last {
		finish = &finishLength
	}
	if !o.started {
		// Headers go out with the first token, so time to first byte is TTFT.
		o.started = true
		h := o.w.Header()
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
		o.w.WriteHeader(http.StatusOK)
		switch o.seq.ep {
		case responsesEndpoint:
			o.responsesStart()
		case messagesEndpoint:
			o.messagesStart()
		case chatEndpoint:
			empty := ""
			r := o.base("chat.completion.chunk")
			r.Choices = []chatChoice{{Delta: &chatDelta{Role: "assistant", Content: &empty}}}
			o.event(r)
		}
	}
	switch o.seq.ep {
	case responsesEndpoint:
		o.responsesToken(tok)
		return o.flush()
	case messagesEndpoint:
		o.messagesToken(tok)
		return o.flush()
	}
	var r response
	if o.seq.ep == chatEndpoint {
		r = o.base("chat.completion.chunk")
		r.Choices = []chatChoice{{Delta: &chatDelta{Content: &tok}, FinishReason: finish}}
	} else {
		r = o.base("text_completion")
		r.Choices = []textChoice{{Text: tok, FinishReason: finish}}
	}
	o.event(r)
	return o.flush()
}

// finish completes the response with the whole answer and usage.
func (o *output) finish(answer string, u usage) {
	switch o.seq.ep {
	case responsesEndpoint:
		o.responsesFinish(answer, u)
		return
	case messagesEndpoint:
		o.messagesFinish(answer, u)
		return
	}
	if !o.seq.req.Stream {
		var r response
		if o.seq.ep == chatEndpoint {
			r = o.base("chat.completion")
			r.Choices = []chatChoice{{Message: &chatMsg{Role: "assistant", Content: answer}, FinishReason: &finishLength}}
		} else {
			r = o.base("text_completion")
			r.Choices = []textChoice{{Text: answer, FinishReason: &finishLength}}
		}
		r.Usage, r.KVTransferParams = &u, o.kv
		writeJSON(o.w, http.StatusOK, r)
		return
	}
	if o.seq.req.IncludeUsage {
		object := "chat.completion.chunk"
		if o.seq.ep == completionEndpoint {
			object = "text_completion"
		}
		r := o.base(object)
		r.Choices = []any{}
		r.Usage = &u
		o.event(r)
	}
	o.buf.WriteString("data: [DONE]\n\n")
	_ = o.flush()
}

func (o *output) event(r response) {
	o.buf.WriteString("data: ")
	b, _ := json.Marshal(r) // plain structs: cannot fail
	o.buf.Write(b)
	o.buf.WriteString("\n\n")
}

func (o *output) flush() error {
	if _, err := o.w.Write(o.buf.Bytes()); err != nil {
		return err
	}
	o.buf.Reset()
	return o.rc.Flush()
}

// apiError is the OpenAI error body.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    any    `json:"code"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	}
	writeJSON(w, status, apiError{Error: apiErrorBody{Message: msg, Type: typ}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding response","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
