package bench

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

func TestReadStream(t *testing.T) {
	tests := []struct {
		name           string
		in             string
		kind           string
		usage          bool
		prompt, cached int64
		completion     int64
	}{
		{
			name: "content, usage, done",
			in: "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n" +
				": keep-alive comment\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
				"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n" +
				"data: [DONE]\n\n",
			usage: true, prompt: 10, cached: 4, completion: 1,
		},
		{
			name:  "no space after data, usage without details",
			in:    "data:{\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\ndata:{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\ndata:[DONE]\n",
			usage: true, prompt: 3, completion: 2,
		},
		{name: "no usage", in: "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"},
		{name: "null error field is fine", in: "data: {\"error\":null,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"},
		{name: "eof without done", in: "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", kind: "stream_cut"},
		{name: "empty body", in: "", kind: "stream_cut"},
		{name: "error event", in: "data: {\"error\":{\"message\":\"x\"}}\n\n", kind: "stream_error"},
		{name: "garbage", in: "data: nope\n\n", kind: "bad_chunk"},
		{name: "huge line", in: "data: " + strings.Repeat("a", maxSSELine+10), kind: "stream_cut"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := readStream(context.Background(), strings.NewReader(tc.in), time.Now())
			if o.kind != tc.kind {
				t.Fatalf("kind %q, want %q", o.kind, tc.kind)
			}
			if o.hasUsage != tc.usage || o.prompt != tc.prompt || o.cached != tc.cached || o.completion != tc.completion {
				t.Fatalf("usage %+v", o)
			}
			if tc.kind == "" && o.ttft <= 0 {
				t.Fatal("no ttft")
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	s := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	tests := []struct {
		p, want float64
	}{{0, 1}, {0.5, 6}, {0.9, 10}, {1, 11}, {0.95, 10.5}}
	for _, tc := range tests {
		if got := percentile(s, tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if percentile(nil, 0.5) != 0 {
		t.Error("empty")
	}
}

// TestReadStreamFirstChunk: a first chunk of no text (vLLM's role chunk,
// sent with a first token whose text is still empty) is the first chunk,
// and TTFT waits for the text after it.
func TestReadStreamFirstChunk(t *testing.T) {
	r, w := io.Pipe()
	go func() {
		// Each write returns once the reader has taken it: the text is
		// written after the role chunk was read.
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
		_ = w.Close()
	}()
	o := readStream(context.Background(), r, time.Now())
	if o.kind != "" || o.firstChunk <= 0 || o.firstChunk >= o.ttft {
		t.Fatalf("kind %q, first chunk %v, ttft %v: want the first chunk before the first text", o.kind, o.firstChunk, o.ttft)
	}
	o = readStream(context.Background(), strings.NewReader("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"), time.Now())
	if o.firstChunk <= 0 || o.firstChunk > o.ttft {
		t.Fatalf("text in the first chunk: first chunk %v, ttft %v", o.firstChunk, o.ttft)
	}
}
