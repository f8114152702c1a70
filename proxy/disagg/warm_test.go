package disagg

import (
	"errors"
	"reflect"
	"testing"
)

// TestWarmBody: a warm request is the client's conversation followed by
// its answer, one token, no stream, in each protocol's prefill-only form;
// bodies whose next turn cannot be told have none.
func TestWarmBody(t *testing.T) {
	chat := `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"tools":[{"type":"function"}],` +
		`"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":100,"n":1,"logprobs":true,"temperature":0.7,` +
		`"cache_salt":"c","kv_transfer_params":{"x":1},"bootstrap_room":5}`
	for _, proto := range []Protocol{VLLM, SGLang} {
		b, err := WarmBody(proto, []byte(chat), "hello \"there\"", 1<<63|9)
		if err != nil {
			t.Fatal(err)
		}
		w := decode(t, b)
		msgs := []any{map[string]any{"role": "system", "content": "s"}, map[string]any{"role": "user", "content": "hi"},
			map[string]any{"role": "assistant", "content": "hello \"there\""}}
		if !reflect.DeepEqual(w["messages"], msgs) {
			t.Errorf("%s: messages %v", proto, w["messages"])
		}
		if w["stream"] != false || w["max_tokens"] != 1.0 || w["temperature"] != 0.7 || w["cache_salt"] != "c" || w["tools"] == nil {
			t.Errorf("%s: body %s", proto, b)
		}
		for _, gone := range []string{"stream_options", "max_completion_tokens", "n", "logprobs", "kv_transfer_params", "bootstrap_port"} {
			if _, ok := w[gone]; ok {
				t.Errorf("%s: keeps %s: %s", proto, gone, b)
			}
		}
		switch proto {
		case VLLM:
			if w["add_generation_prompt"] != false || w["bootstrap_room"] != nil || w["bootstrap_host"] != nil {
				t.Errorf("vllm: %s", b)
			}
		case SGLang:
			if w["bootstrap_host"] != FakeBootstrapHost || w["bootstrap_room"] != 9.0 || w["add_generation_prompt"] != nil {
				t.Errorf("sglang: %s", b)
			}
		}
	}
	b, err := WarmBody(VLLM, []byte(`{"model":"m","prompt":"Once upon","max_tokens":9,"echo":true}`), " a time", 0)
	if err != nil {
		t.Fatal(err)
	}
	if w := decode(t, b); w["prompt"] != "Once upon a time" || w["max_tokens"] != 1.0 || w["echo"] != nil {
		t.Errorf("completion: %s", b)
	}
	for _, c := range []struct{ body, answer string }{
		{`{"model":"m","prompt":"x"}`, ""},
		{`{"model":"m","prompt":[1,2,3]}`, "a"},
		{`{"model":"m","prompt":"x","suffix":"y"}`, "a"},
		{`{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}],"continue_final_message":true}`, "a"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"add_generation_prompt":false}`, "a"},
		{`{"model":"m","messages":[]}`, "a"},
	} {
		if _, err := WarmBody(VLLM, []byte(c.body), c.answer, 0); !errors.Is(err, ErrNoWarm) {
			t.Errorf("%s with answer %q: %v, want ErrNoWarm", c.body, c.answer, err)
		}
	}
	if _, err := WarmBody(VLLM, []byte(`{"model":"m","prompt":["a","b"]}`), "a", 0); !errors.Is(err, ErrBatch) {
		t.Errorf("a batch: %v", err)
	}
	if _, err := WarmBody(VLLM, []byte(`{"model":`), "a", 0); err == nil {
		t.Error("a broken body makes a warm request")
	}
}
