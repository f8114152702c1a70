package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/trace"
)

// outcome is what one request produced.
type outcome struct {
	kind string // "" when the request completed
	ttft time.Duration
	// firstChunk is the time to the first chunk with a choice, even one
	// of no text (vLLM's role chunk comes with the first token, whose
	// text may be empty: a piece of a character still to complete).
	firstChunk time.Duration
	hasUsage   bool
	prompt     int64
	cached     int64
	completion int64
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatRequest struct {
	Model     string        `json:"model"`
	Messages  []chatMessage `json:"messages"`
	MaxTokens int           `json:"max_tokens"`
	// IgnoreEOS asks the engine to answer to max_tokens (llama.cpp's
	// server, vLLM); omitted when false, as engines without it expect.
	IgnoreEOS     bool `json:"ignore_eos,omitempty"`
	Stream        bool `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// chunk is the part of a chat.completion.chunk (or an error event) we read.
type chunk struct {
	Choices []struct {
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int64 `json:"prompt_tokens"`
		CompletionTokens    int64 `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// maxSSELine bounds one server-sent-events line; chunks are small, so a
// longer line means a broken server.
const maxSSELine = 4 << 20

// doRequest sends one streaming chat completion and reads it to the end.
func doRequest(ctx context.Context, client *http.Client, url, model string, r trace.Request, bytesPerToken int) outcome {
	body := chatRequest{
		Model:     model,
		Messages:  []chatMessage{{Role: "user", Content: trace.Synthesize(r.HashIDs, r.InputTokens, bytesPerToken)}},
		MaxTokens: max(r.OutputTokens, 1),
		Stream:    true,
	}
	body.StreamOptions.IncludeUsage = true
	buf, err := json.Marshal(body)
	if err != nil {
		return outcome{kind: "encode"}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(buf))
	if err != nil {
		return outcome{kind: "bad_url"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")

	sent := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return outcome{kind: errKind(ctx, err, "connect")}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		return outcome{kind: fmt.Sprintf("http_%d", resp.StatusCode)}
	}
	return readStream(ctx, resp.Body, sent)
}

// readStream parses an OpenAI SSE stream. TTFT is the time from sent to the
// first chunk with non-empty delta content (or reasoning content, which
// reasoning models stream first); a stream that finishes without any
// content takes its end as TTFT, since that is when the user saw it end.
func readStream(ctx context.Context, body io.Reader, sent time.Time) outcome {
	return readStreamInto(ctx, body, sent, nil)
}

// readStreamInto is readStream that also appends the streamed content of
// the choices to answer, when answer is not nil.
func readStreamInto(ctx context.Context, body io.Reader, sent time.Time, answer *strings.Builder) outcome {
	var o outcome
	gotFirst := false
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 16<<10), maxSSELine)
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank separators, comments, event:/id: fields
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			if !gotFirst {
				o.ttft = time.Since(sent)
			}
			return o
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return outcome{kind: "bad_chunk"}
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			return outcome{kind: "stream_error"}
		}
		if answer != nil {
			for _, ch := range c.Choices {
				answer.WriteString(ch.Delta.Content)
			}
		}
		if o.firstChunk == 0 && len(c.Choices) > 0 {
			o.firstChunk = time.Since(sent)
		}
		if !gotFirst {
			for _, ch := range c.Choices {
				if ch.Delta.Content != "" || ch.Delta.ReasoningContent != "" {
					o.ttft = time.Since(sent)
					gotFirst = true
					break
				}
			}
		}
		if c.Usage != nil {
			o.hasUsage = true
			o.prompt = c.Usage.PromptTokens
			o.completion = c.Usage.CompletionTokens
			if d := c.Usage.PromptTokensDetails; d != nil {
				o.cached = d.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		return outcome{kind: errKind(ctx, err, "stream_cut")}
	}
	return outcome{kind: "stream_cut"} // EOF before [DONE]
}

// errKind names a transport error: the run's cancellation, a timeout, or
// the given fallback.
func errKind(ctx context.Context, err error, fallback string) string {
	if ctx.Err() != nil {
		return "canceled"
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout"
	}
	return fallback
}
