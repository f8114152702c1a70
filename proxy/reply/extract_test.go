package reply

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// refExtract is extractAnswer's specification written with encoding/json:
// decode into a map (exact keys, last duplicate wins) and walk it.
func refExtract(doc []byte) (string, Usage, bool) {
	if !json.Valid(doc) {
		return "", Usage{}, false
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", Usage{}, false
	}
	top, ok := v.(map[string]any)
	if !ok {
		return "", Usage{}, true
	}
	asInt := func(x any) (int64, bool) {
		n, ok := x.(json.Number)
		if !ok {
			return 0, false
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			return 0, false
		}
		return i, true
	}
	content := func(x any) (string, bool) {
		m, ok := x.(map[string]any)
		if !ok {
			return "", false
		}
		s, ok := m["content"].(string)
		return s, ok
	}
	var text strings.Builder
	if cs, ok := top["choices"].([]any); ok {
		for _, c := range cs {
			m, ok := c.(map[string]any)
			if !ok {
				continue
			}
			if idx, present := m["index"]; present && idx != nil {
				if i, ok := asInt(idx); !ok || i != 0 {
					continue
				}
			}
			if s, ok := content(m["delta"]); ok {
				text.WriteString(s)
			} else if s, ok := content(m["message"]); ok {
				text.WriteString(s)
			} else if s, ok := m["text"].(string); ok {
				text.WriteString(s)
			}
		}
	}
	// The usage objects, the top level's over "response"'s over
	// "message"'s, field by field: the integer fields each names.
	var objs []map[string]any
	for _, within := range []string{"message", "response"} {
		if m, ok := top[within].(map[string]any); ok {
			if um, ok := m["usage"].(map[string]any); ok {
				objs = append(objs, um)
			}
		}
	}
	if um, ok := top["usage"].(map[string]any); ok {
		objs = append(objs, um)
	}
	ints := map[string]int64{}
	for _, um := range objs {
		for k, x := range um {
			if i, ok := asInt(x); ok {
				ints[k] = i
			}
		}
		for _, d := range []string{"prompt_tokens_details", "input_tokens_details"} {
			if dm, ok := um[d].(map[string]any); ok {
				if i, ok := asInt(dm["cached_tokens"]); ok {
					ints["\x00"+d] = i // no key of the document's
				}
			}
		}
	}
	return text.String(), refUsage(len(objs) > 0, ints), true
}

// refUsage resolves the integer fields of a response's usage objects.
func refUsage(present bool, ints map[string]int64) Usage {
	u := Usage{Present: present}
	if v, ok := ints["prompt_tokens"]; ok {
		u.PromptTokens = v
	} else {
		u.PromptTokens = ints["input_tokens"] + ints["cache_read_input_tokens"] + ints["cache_creation_input_tokens"]
	}
	if v, ok := ints["completion_tokens"]; ok {
		u.CompletionTokens = v
	} else {
		u.CompletionTokens = ints["output_tokens"]
	}
	for _, k := range []string{"\x00prompt_tokens_details", "\x00input_tokens_details", "cache_read_input_tokens"} {
		if v, ok := ints[k]; ok {
			u.CachedTokens, u.HasCached = v, true
			break
		}
	}
	return u
}

var extractCases = []string{
	`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}`,
	`{"choices":[{"index":0,"delta":{"content":" w\u00f6rld \"q\"\n"}}]}`,
	`{"choices":[{"index":0,"text":"completion text"}]}`,
	`{"choices":[{"index":1,"delta":{"content":"other"}},{"delta":{"content":"no index"}}]}`,
	`{"choices":[],"usage":{"prompt_tokens":90,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}}`,
	`{"choices":[{"index":0,"message":{"content":"whole"},"text":"x"}],"usage":{"prompt_tokens":-5}}`,
	`{"choices":[{"index":0,"delta":{"content":null},"text":"fallback"}],"usage":null}`,
	`{"choices":[{"index":0,"delta":{"content":"a"}}],"choices":[{"index":0,"delta":{"content":"b"}}]}`,
	`{"usage":{"completion_tokens":7,"completion_tokens":"x","prompt_tokens":2}}`,
	`{"usage":{"completion_tokens":99999999999999999999,"prompt_tokens":2}}`,
	`{"usage":{"prompt_tokens":1.5,"prompt_tokens_details":{"cached_tokens":1e3}}}`,
	`{"choices":[{"index":0,"delta":{"content":"\ud83d\ude00 \ud800 x"}}]}`,
	"{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"bad \xff utf8\"}}]}",
	`{"cho\u0069ces":[{"index":-0,"delta":{"content":"escaped key"}}]}`,
	`[1,2,{"choices":[]}]`,
	`{"choices":[{"index":0,"delta":{"content":"trailing"}}],}`,
	`{"choices":[{"index":0,"delta":{"content":"x"}}]} x`,
	// Responses: a whole body, a stream's response.created (usage null)
	// and response.completed.
	`{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":64},"output_tokens":9,"total_tokens":129}}`,
	`{"type":"response.created","response":{"id":"resp_1","usage":null}}`,
	`{"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","status":"completed","usage":{"input_tokens":50,"output_tokens":7,"input_tokens_details":{"cached_tokens":"x"}}}}`,
	// Anthropic Messages: a whole body, message_start, message_delta.
	`{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"cache_read_input_tokens":80,"cache_creation_input_tokens":6,"output_tokens":4}}`,
	`{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":10,"cache_read_input_tokens":80,"output_tokens":0}}}`,
	`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15,"input_tokens":null}}`,
	// Several usage objects in one document, and duplicates.
	`{"usage":{"output_tokens":3},"message":{"usage":{"input_tokens":2,"output_tokens":1}},"response":{"usage":{"input_tokens":5}}}`,
	`{"response":{"usage":{"input_tokens":5}},"response":{"id":"r"},"message":[],"message":{"usage":7}}`,
	`{"usage":{"prompt_tokens":4,"input_tokens":9,"completion_tokens":null,"output_tokens":2,"prompt_tokens_details":{"cached_tokens":1},"prompt_tokens_details":3}}`,
	`{"a":[01]}`,
	`{"a":"\x"}`,
	`{"a":tru}`,
	``,
	`null`,
}

func TestExtractAnswerMatchesReference(t *testing.T) {
	for _, c := range extractCases {
		checkExtract(t, []byte(c))
	}
	deep := strings.Repeat("[", jsonscan.MaxDepth) + strings.Repeat("]", jsonscan.MaxDepth)
	checkExtract(t, []byte(`{"a":`+deep[1:len(deep)-1]+`}`))
	checkExtract(t, []byte(`{"a":`+deep+`}`))
}

func checkExtract(t *testing.T, doc []byte) {
	t.Helper()
	prefix := []byte("kept:")
	got, gu, gok := extractAnswer(bytes.Clone(prefix), doc)
	want, wu, wok := refExtract(doc)
	if gok != wok || gu != wu {
		t.Fatalf("%q: ok %v usage %+v, want ok %v usage %+v", doc, gok, gu, wok, wu)
	}
	if !bytes.HasPrefix(got, prefix) {
		t.Fatalf("%q: lost the bytes already in dst", doc)
	}
	if gok && string(got[len(prefix):]) != want {
		t.Fatalf("%q: text %q, want %q", doc, got[len(prefix):], want)
	}
	if !gok && len(got) != len(prefix) {
		t.Fatalf("%q: invalid document appended %q", doc, got[len(prefix):])
	}
}

// FuzzExtractAnswer holds the byte-level extractor to its encoding/json
// specification, including json.Valid's accept/reject decision.
func FuzzExtractAnswer(f *testing.F) {
	for _, c := range extractCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkExtract(t, doc)
	})
}

// TestSinkSplitsAnywhere: a stream cut at every byte boundary yields the
// same answer and usage as in one piece.
func TestSinkSplitsAnywhere(t *testing.T) {
	stream := []byte(streamOf(20))
	whole := NewSink(true, nil)
	whole.Feed(stream)
	whole.Finish()
	for cut := range len(stream) {
		s := NewSink(true, nil)
		s.Feed(stream[:cut])
		s.Feed(stream[cut:])
		s.Finish()
		if string(s.answer) != string(whole.answer) || s.usage != whole.usage || !s.done {
			t.Fatalf("cut at %d: %q %+v, want %q %+v", cut, s.answer, s.usage, whole.answer, whole.usage)
		}
		s.Release()
	}
	if !whole.usage.HasCached || whole.usage.CachedTokens != 48 || len(whole.answer) != 20*len("token ") {
		t.Fatalf("answer %q usage %+v", whole.answer, whole.usage)
	}
}

// streamOf is a vLLM-shaped chat stream of n one-token deltas.
func streamOf(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"token \"},\"logprobs\":null,\"finish_reason\":null}]}\r\n\r\n")
		_ = i
	}
	b.WriteString("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"total_tokens\":120,\"completion_tokens\":20,\"prompt_tokens_details\":{\"cached_tokens\":48}}}\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// BenchmarkAnswerSink is the answer recording of one 1,000-token stream,
// fed in 4 KB reads: the byte-level extractor with and without the chunk
// template against a per-chunk encoding/json decode.
func BenchmarkAnswerSink(b *testing.B) {
	stream := []byte(streamOf(1000))
	feed := func(s interface{ Feed([]byte) }) {
		for i := 0; i < len(stream); i += 4096 {
			s.Feed(stream[i:min(i+4096, len(stream))])
		}
	}
	b.Run("extractor", func(b *testing.B) {
		b.SetBytes(int64(len(stream)))
		b.ReportAllocs()
		for b.Loop() {
			s := NewSink(true, nil)
			feed(s)
			s.Finish()
			if len(s.answer) != 6000 {
				b.Fatal(len(s.answer))
			}
			s.Release()
		}
	})
	b.Run("extractor-no-template", func(b *testing.B) {
		b.SetBytes(int64(len(stream)))
		b.ReportAllocs()
		for b.Loop() {
			s := NewSink(true, nil)
			s.plain = true
			feed(s)
			s.Finish()
			if len(s.answer) != 6000 {
				b.Fatal(len(s.answer))
			}
			s.Release()
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(stream)))
		b.ReportAllocs()
		for b.Loop() {
			s := &jsonSink{}
			feed(s)
			if len(s.answer) != 6000 {
				b.Fatal(len(s.answer))
			}
		}
	})
}

// jsonSink is a per-chunk encoding/json reader, the benchmark's baseline.
type jsonSink struct {
	buf    []byte
	answer []byte
}

func (s *jsonSink) Feed(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.buf = append(s.buf, b...)
			return
		}
		line := b[:i]
		b = b[i+1:]
		if len(s.buf) > 0 {
			s.buf = append(s.buf, line...)
			line = s.buf
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			var c struct {
				Choices []struct {
					Index int `json:"index"`
					Delta *struct {
						Content *string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal(bytes.TrimSpace(data), &c) == nil {
				for _, ch := range c.Choices {
					if ch.Index == 0 && ch.Delta != nil && ch.Delta.Content != nil {
						s.answer = append(s.answer, *ch.Delta.Content...)
					}
				}
			}
		}
		s.buf = s.buf[:0]
	}
}

// BenchmarkExtractAnswer is one vLLM-shaped stream chunk.
func BenchmarkExtractAnswer(b *testing.B) {
	doc := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"content":"token "},"logprobs":null,"finish_reason":null}]}`)
	var dst []byte
	b.SetBytes(int64(len(doc)))
	for b.Loop() {
		dst, _, _ = extractAnswer(dst[:0], doc)
	}
}

// FuzzSinkTemplate holds the template fast path to the full extractor:
// any stream gives the same answer and usage read either way.
func FuzzSinkTemplate(f *testing.F) {
	f.Add([]byte(streamOf(5)), 7)
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\\\"\\u00e9\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c\\\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"d\"}}]}\n"), 3)
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}},{\"index\":0,\"delta\":{\"content\":\"\"}}]}\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"y\"}},{\"index\":0,\"delta\":{\"content\":\"\"}}]}\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}},{\"index\":0,\"delta\":{\"content\":\"\"}}]}\n"), 1)
	f.Fuzz(func(t *testing.T, stream []byte, cut int) {
		fast, ref := NewSink(true, nil), NewSink(true, nil)
		ref.plain = true
		cut = min(max(cut, 0), len(stream))
		for _, s := range []*Sink{fast, ref} {
			s.Feed(stream[:cut])
			s.Feed(stream[cut:])
			s.Finish()
		}
		if !bytes.Equal(fast.answer, ref.answer) || fast.usage != ref.usage || fast.done != ref.done {
			t.Fatalf("template path %q %+v, full path %q %+v", fast.answer, fast.usage, ref.answer, ref.usage)
		}
		fast.Release()
		ref.Release()
	})
}

// TestTemplateIsUsed: after the first delta chunk the template serves
// the rest of a vLLM-shaped stream.
func TestTemplateIsUsed(t *testing.T) {
	s := NewSink(true, nil)
	st := streamOf(3)
	s.Feed([]byte(st[:strings.LastIndex(st[:strings.Index(st, `"usage"`)], "data:")])) // the delta chunks only
	if !s.tpl.ok || !bytes.HasSuffix(s.tpl.pre, []byte(`"content":"`)) || !bytes.HasPrefix(s.tpl.suf, []byte(`"},"logprobs"`)) {
		t.Fatalf("template %v %q %q", s.tpl.ok, s.tpl.pre, s.tpl.suf)
	}
	s.Release()
}

// TestSinkReadsUsageOfEveryAPI: the usage of a Responses or Anthropic
// Messages answer is read as a chat completion's is, streamed (its
// objects merged across events: Anthropic's message_start tells the
// input, message_delta the output) or whole.
func TestSinkReadsUsageOfEveryAPI(t *testing.T) {
	const (
		responsesStream = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"usage\":null}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":120,\"input_tokens_details\":{\"cached_tokens\":64},\"output_tokens\":9,\"total_tokens\":129}}}\n\n"
		responsesBody  = `{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":64},"output_tokens":9}}`
		messagesStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":56,\"cache_read_input_tokens\":64,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
		messagesBody = `{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":56,"cache_read_input_tokens":64,"cache_creation_input_tokens":0,"output_tokens":9}}`
	)
	want := Usage{Present: true, PromptTokens: 120, CompletionTokens: 9, HasCached: true, CachedTokens: 64}
	for _, tc := range []struct {
		name, body string
		sse        bool
	}{
		{"responses stream", responsesStream, true}, {"responses body", responsesBody, false},
		{"messages stream", messagesStream, true}, {"messages body", messagesBody, false},
	} {
		for cut := range len(tc.body) {
			s := NewSink(tc.sse, nil)
			s.Feed([]byte(tc.body[:cut]))
			s.Feed([]byte(tc.body[cut:]))
			s.Finish()
			if got := s.Usage(); got != want {
				t.Fatalf("%s cut at %d: usage %+v, want %+v", tc.name, cut, got, want)
			}
			s.Release()
		}
	}
}
