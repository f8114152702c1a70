package replicasim

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
)

// apiResult is one Responses or Messages answer, streamed or not.
type apiResult struct {
	ID     string
	Text   string
	Input  int // prompt tokens (Messages: uncached + cached)
	Cached int
	Output int
	Events []string // streaming: the event names in order
}

// call runs one Responses or Messages request and decodes either form.
func (h *harness) call(path string, body map[string]any) apiResult {
	h.t.Helper()
	resp := h.post(context.Background(), path, body)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("POST %s: status %d: %s", path, resp.StatusCode, b)
	}
	var res apiResult
	take := func(obj map[string]any) {
		b, _ := json.Marshal(obj)
		if path == "/v1/responses" {
			var r struct {
				ID     string `json:"id"`
				Output []struct {
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
				} `json:"output"`
				Usage *responsesUsage `json:"usage"`
			}
			if err := json.Unmarshal(b, &r); err != nil {
				h.t.Fatal(err)
			}
			res.ID = r.ID
			if len(r.Output) == 1 && len(r.Output[0].Content) == 1 {
				res.Text = r.Output[0].Content[0].Text
			}
			if r.Usage != nil {
				res.Input, res.Cached, res.Output = r.Usage.InputTokens, r.Usage.InputTokensDetails.CachedTokens, r.Usage.OutputTokens
			}
			return
		}
		var m anthropicMessage
		if err := json.Unmarshal(b, &m); err != nil {
			h.t.Fatal(err)
		}
		res.ID = m.ID
		if len(m.Content) == 1 {
			res.Text = m.Content[0].Text
		}
		res.Input, res.Cached, res.Output = m.Usage.InputTokens+m.Usage.CacheReadInputTokens, m.Usage.CacheReadInputTokens, m.Usage.OutputTokens
	}
	if stream, _ := body["stream"].(bool); !stream {
		var obj map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&obj); err != nil {
			h.t.Fatal(err)
		}
		take(obj)
		return res
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		h.t.Fatalf("stream Content-Type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var name, streamed string
	seq := 0.0
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
			res.Events = append(res.Events, name)
		case strings.HasPrefix(line, "data: "):
			var ev map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
				h.t.Fatalf("bad event data %q: %v", line, err)
			}
			if ev["type"] != name {
				h.t.Fatalf("event %q carries type %v", name, ev["type"])
			}
			if path == "/v1/responses" {
				if ev["sequence_number"] != seq {
					h.t.Fatalf("event %q: sequence_number %v, want %v", name, ev["sequence_number"], seq)
				}
				seq++
			}
			switch name {
			case "response.output_text.delta":
				streamed += ev["delta"].(string)
			case "content_block_delta":
				streamed += ev["delta"].(map[string]any)["text"].(string)
			case "response.completed":
				take(ev["response"].(map[string]any))
			case "message_start":
				take(ev["message"].(map[string]any))
			case "message_delta":
				res.Output = int(ev["usage"].(map[string]any)["output_tokens"].(float64))
			}
		default:
			h.t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if path == "/v1/responses" && res.Text != streamed {
		h.t.Fatalf("streamed text %q, completed response says %q", streamed, res.Text)
	}
	res.Text = streamed
	return res
}

// TestNewAPIsNextTurnHitsCache: a Responses conversation (input sent again,
// or previous_response_id) and a Messages conversation find their first
// turn, prompt and answer, in the prefix cache.
func TestNewAPIsNextTurnHitsCache(t *testing.T) {
	const bs = 16
	question, followUp := "What is a KV cache?", "And why does it matter?"
	cases := []struct {
		name string
		path string
		// turns returns the request bodies of turn 1 and, given it, turn 2.
		first  func(stream bool) map[string]any
		second func(stream bool, r1 apiResult) map[string]any
	}{
		{"responses input", "/v1/responses",
			func(stream bool) map[string]any {
				return map[string]any{"model": "kvmesh-sim", "instructions": longSystem, "input": question, "max_output_tokens": 50, "stream": stream}
			},
			func(stream bool, r1 apiResult) map[string]any {
				return map[string]any{"model": "kvmesh-sim", "instructions": longSystem, "max_output_tokens": 10, "stream": stream, "input": []any{
					map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": question}}},
					map[string]any{"type": "message", "role": "assistant", "id": "msg_x", "status": "completed",
						"content": []any{map[string]any{"type": "output_text", "text": r1.Text, "annotations": []any{}}}},
					map[string]any{"role": "user", "content": followUp},
				}}
			}},
		{"responses previous_response_id", "/v1/responses",
			func(stream bool) map[string]any {
				return map[string]any{"model": "kvmesh-sim", "instructions": longSystem, "input": question, "max_output_tokens": 50, "stream": stream}
			},
			func(stream bool, r1 apiResult) map[string]any {
				return map[string]any{"model": "kvmesh-sim", "previous_response_id": r1.ID, "input": followUp, "max_output_tokens": 10, "stream": stream}
			}},
		{"messages", "/v1/messages",
			func(stream bool) map[string]any {
				return map[string]any{"model": "kvmesh-sim", "system": longSystem, "max_tokens": 50, "stream": stream,
					"messages": []any{map[string]any{"role": "user", "content": question}}}
			},
			func(stream bool, r1 apiResult) map[string]any {
				return map[string]any{"model": "kvmesh-sim", "system": []any{map[string]any{"type": "text", "text": longSystem}}, "max_tokens": 10, "stream": stream,
					"messages": []any{
						map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": question}}},
						map[string]any{"role": "assistant", "content": r1.Text},
						map[string]any{"role": "user", "content": followUp},
					}}
			}},
	}
	for _, tc := range cases {
		for _, stream := range []bool{false, true} {
			name := tc.name
			if stream {
				name += " stream"
			}
			t.Run(name, func(t *testing.T) {
				h := newHarness(t, Config{TimeScale: fast})
				r1 := h.call(tc.path, tc.first(stream))
				if r1.Cached != 0 || r1.Output != 50 || countTokens(r1.Text) != 50 || r1.ID == "" {
					t.Fatalf("turn 1: %+v, want 50 output tokens, none cached, an id", r1)
				}
				r2 := h.call(tc.path, tc.second(stream, r1))
				if want := r1.Input + r1.Output - bs; r2.Cached < want || r2.Cached >= r2.Input {
					t.Fatalf("turn 2 cached %d of %d input tokens, want at least %d (turn 1: %d in, %d out)", r2.Cached, r2.Input, want, r1.Input, r1.Output)
				}
			})
		}
	}
}

func TestNewAPIsStreamEvents(t *testing.T) {
	h := newHarness(t, Config{TimeScale: fast})
	r := h.call("/v1/responses", map[string]any{"model": "kvmesh-sim", "input": "hi", "max_output_tokens": 2, "stream": true})
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.done response.content_part.done " +
		"response.output_item.done response.completed"
	if got := strings.Join(r.Events, " "); got != want {
		t.Errorf("Responses events:\n%s\nwant\n%s", got, want)
	}
	m := h.call("/v1/messages", map[string]any{"model": "kvmesh-sim", "max_tokens": 2, "stream": true, "messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	want = "message_start content_block_start ping content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if got := strings.Join(m.Events, " "); got != want {
		t.Errorf("Messages events:\n%s\nwant\n%s", got, want)
	}
	if m.Output != 2 {
		t.Errorf("Messages output tokens %d, want 2", m.Output)
	}
}

func TestNewAPIsErrors(t *testing.T) {
	h := newHarness(t, Config{TimeScale: fast})
	tests := []struct {
		name, path, body string
		status           int
	}{
		{"unknown previous response", "/v1/responses", `{"model":"kvmesh-sim","input":"x","previous_response_id":"resp_nope"}`, 404},
		{"responses without input", "/v1/responses", `{"model":"kvmesh-sim"}`, 400},
		{"responses bad item", "/v1/responses", `{"model":"kvmesh-sim","input":[{"content":"x"}]}`, 400},
		{"messages without max_tokens", "/v1/messages", `{"model":"kvmesh-sim","messages":[{"role":"user","content":"x"}]}`, 400},
		{"messages bad role", "/v1/messages", `{"model":"kvmesh-sim","max_tokens":1,"messages":[{"role":"system","content":"x"}]}`, 400},
		{"messages wrong model", "/v1/messages", `{"model":"other","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, 404},
		{"embeddings without input", "/v1/embeddings", `{"model":"kvmesh-sim"}`, 400},
		{"embeddings bad format", "/v1/embeddings", `{"model":"kvmesh-sim","input":"x","encoding_format":"hex"}`, 400},
		{"embeddings wrong model", "/v1/embeddings", `{"model":"other","input":"x"}`, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(context.Background(), tc.path, tc.body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(b), `"error"`) {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, b, tc.status)
			}
		})
	}
	// A response stored with store=false cannot be continued.
	r := h.call("/v1/responses", map[string]any{"model": "kvmesh-sim", "input": "x", "max_output_tokens": 1, "store": false})
	resp := h.post(context.Background(), "/v1/responses", map[string]any{"model": "kvmesh-sim", "input": "y", "previous_response_id": r.ID})
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("continuing an unstored response: status %d, want 404", resp.StatusCode)
	}
}

func TestEmbeddings(t *testing.T) {
	h := newHarness(t, Config{TimeScale: fast})
	get := func(body map[string]any) (vecs [][]float32, tokens int) {
		t.Helper()
		resp := h.post(context.Background(), "/v1/embeddings", body)
		defer resp.Body.Close()
		var out struct {
			Data []struct {
				Index     int             `json:"index"`
				Embedding json.RawMessage `json:"embedding"`
			} `json:"data"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		for i, d := range out.Data {
			if d.Index != i {
				t.Fatalf("data[%d].index = %d", i, d.Index)
			}
			var v []float32
			if err := json.Unmarshal(d.Embedding, &v); err != nil {
				var s string
				if err := json.Unmarshal(d.Embedding, &s); err != nil {
					t.Fatal(err)
				}
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					t.Fatal(err)
				}
				v = make([]float32, len(b)/4)
				for j := range v {
					v[j] = float32frombits(b[4*j:])
				}
			}
			vecs = append(vecs, v)
		}
		return vecs, out.Usage.PromptTokens
	}
	plain, tokens := get(map[string]any{"model": "kvmesh-sim", "input": []string{"hello world!", "other"}})
	b64, _ := get(map[string]any{"model": "kvmesh-sim", "input": "hello world!", "encoding_format": "base64", "dimensions": embeddingDims})
	if len(plain) != 2 || len(plain[0]) != embeddingDims || tokens != 3+2 {
		t.Fatalf("got %d vectors of %d, %d tokens", len(plain), len(plain[0]), tokens)
	}
	var norm float64
	for j := range plain[0] {
		norm += float64(plain[0][j]) * float64(plain[0][j])
		if plain[0][j] != b64[0][j] {
			t.Fatalf("base64 and float encodings differ at %d", j)
		}
	}
	if norm < 0.999 || norm > 1.001 || plain[0][0] == plain[1][0] {
		t.Errorf("norm %v; vectors of different inputs start alike: %v", norm, plain[0][0] == plain[1][0])
	}
}

func float32frombits(b []byte) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b))
}

// FuzzParseNewAPIs: Responses and Messages bodies never panic the parser,
// every failure is a 400, and every render ends with the generation prompt.
func FuzzParseNewAPIs(f *testing.F) {
	f.Add([]byte(`{"model":"m","instructions":"s","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","name":"f","arguments":"{}"},{"type":"function_call_output","output":"1"},{"type":"reasoning"}],"max_output_tokens":3}`))
	f.Add([]byte(`{"input":"x","previous_response_id":"resp_1","store":false}`))
	f.Add([]byte(`{"system":[{"type":"text","text":"s"}],"max_tokens":2,"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image","source":{}}]}]}`))
	f.Add([]byte(`{"max_tokens":0,"messages":[]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, ep := range []endpoint{responsesEndpoint, messagesEndpoint} {
			p, err := parseRequest(ep, body)
			if err != nil {
				if !errors.Is(err, errBadRequest) {
					t.Fatalf("error %v does not wrap errBadRequest", err)
				}
				continue
			}
			if !strings.HasSuffix(p.Prompt, genPrompt) || p.MaxTokens < 0 {
				t.Fatalf("render %q (max tokens %d)", p.Prompt, p.MaxTokens)
			}
		}
	})
}

func TestRetrieveStoredResponse(t *testing.T) {
	h := newHarness(t, Config{TimeScale: fast})
	r := h.call("/v1/responses", map[string]any{"model": "kvmesh-sim", "input": "hello", "max_output_tokens": 3, "stream": true})
	req, _ := http.NewRequest(http.MethodGet, h.ts.URL+"/v1/responses/"+r.ID, nil)
	resp, err := h.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var obj responseObject
	err = json.NewDecoder(resp.Body).Decode(&obj)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d: %v", resp.StatusCode, err)
	}
	if obj.ID != r.ID || obj.Status != "completed" || len(obj.Output) != 1 || obj.Output[0].Content[0].Text != r.Text || obj.Usage == nil {
		t.Fatalf("retrieved %+v, streamed id %s text %q", obj, r.ID, r.Text)
	}
	req, _ = http.NewRequest(http.MethodGet, h.ts.URL+"/v1/responses/resp_unknown", nil)
	if resp, err = h.c.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("unknown response: status %d, want 404", resp.StatusCode)
	}
}
