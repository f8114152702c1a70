package disagg

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

func TestVLLMPrefillAndDecode(t *testing.T) {
	client := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},` +
		`"max_tokens":100,"max_completion_tokens":100,"min_tokens":5,"temperature":0.7,"kv_transfer_params":{"x":1}}`
	pb, err := VLLMPrefill([]byte(client))
	if err != nil {
		t.Fatal(err)
	}
	p := decode(t, pb)
	want := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	if !reflect.DeepEqual(p["kv_transfer_params"], want) {
		t.Errorf("prefill kv_transfer_params %v", p["kv_transfer_params"])
	}
	if p["stream"] != false || p["max_tokens"] != 1.0 || p["max_completion_tokens"] != 1.0 || p["temperature"] != 0.7 || p["model"] != "m" {
		t.Errorf("prefill body %s", pb)
	}
	for _, gone := range []string{"stream_options", "min_tokens"} {
		if _, ok := p[gone]; ok {
			t.Errorf("prefill body keeps %s: %s", gone, pb)
		}
	}
	if !strings.HasPrefix(string(pb), `{"model":"m","messages":`) {
		t.Errorf("the members' order changed: %s", pb)
	}

	answer := `{"id":"cmpl-1","choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,` +
		`"remote_block_ids":[1,2,3],"remote_engine_id":"e1","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}`
	params, err := VLLMParams([]byte(answer))
	if err != nil {
		t.Fatal(err)
	}
	db, err := VLLMDecode([]byte(client), params)
	if err != nil {
		t.Fatal(err)
	}
	d := decode(t, db)
	kv := d["kv_transfer_params"].(map[string]any)
	if kv["do_remote_prefill"] != true || kv["remote_engine_id"] != "e1" || kv["remote_port"] != 5600.0 || len(kv["remote_block_ids"].([]any)) != 3 {
		t.Errorf("decode kv_transfer_params %v", kv)
	}
	if d["stream"] != true || d["max_tokens"] != 100.0 || d["min_tokens"] != 5.0 || d["stream_options"] == nil {
		t.Errorf("decode body %s", db)
	}
	// No params from the prefill: the decode replica computes the
	// prompt, and the client's own params do not reach it.
	db, err = VLLMDecode([]byte(client), nil)
	if err != nil || strings.Contains(string(db), "kv_transfer_params") {
		t.Errorf("decode without params: %s %v", db, err)
	}
}

func TestVLLMParams(t *testing.T) {
	for _, tc := range []struct {
		answer string
		want   string
		ok     bool
	}{
		{`{"id":"x"}`, "", true},
		{`{"kv_transfer_params":null}`, "", true},
		{`{"kv_transfer_params": { "a" : [1, 2] } }`, `{"a":[1,2]}`, true},
		{`{"kv_transfer_params":[1]}`, "", false},
		{`{"kv_transfer_params":"x"}`, "", false},
		{`[1]`, "", false},
		{`{"kv_transfer_params":{}} {}`, "", false},
		{`{"kv_transfer_params":{}}xyz`, "", false},
		{`{"error":{"message":"bad"}`, "", false},
	} {
		got, err := VLLMParams([]byte(tc.answer))
		if (err == nil) != tc.ok || string(got) != tc.want {
			t.Errorf("%s: got %s %v, want %s ok %v", tc.answer, got, err, tc.want, tc.ok)
		}
	}
	if _, err := VLLMParams([]byte(`{"a":"` + strings.Repeat("x", MaxPrefillAnswer) + `"}`)); err == nil {
		t.Error("an answer over the bound is read")
	}
}

func TestSGLangBody(t *testing.T) {
	client := `{"model":"m","prompt":"hi","stream":true,"bootstrap_room":5,"bootstrap_host":"evil","bootstrap_room":6}`
	b, err := SGLangBody([]byte(client), Bootstrap{Host: "10.0.0.7", Port: 8998, Room: 1<<63 + 42})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); got != `{"model":"m","prompt":"hi","stream":true,"bootstrap_room":42,"bootstrap_host":"10.0.0.7","bootstrap_port":8998}` {
		t.Errorf("body %s", got)
	}
	b, err = SGLangBody([]byte(`{"prompt":"x"}`), Bootstrap{Host: "h", Room: 1})
	if err != nil || string(b) != `{"prompt":"x","bootstrap_host":"h","bootstrap_port":null,"bootstrap_room":1}` {
		t.Errorf("unknown port: %s %v", b, err)
	}
}

func TestBatchesAreNotSplit(t *testing.T) {
	for body, batch := range map[string]bool{
		`{"prompt":["a","b"]}`:             true,
		`{"prompt":[[1,2],[3]]}`:           true,
		`{"messages":[],"n":2}`:            true,
		`{"messages":[],"n":"2"}`:          true,
		`{"prompt":["a"]}`:                 false,
		`{"prompt":[1,2,3]}`:               false,
		`{"messages":[],"n":1}`:            false,
		`{"messages":[],"n":null}`:         false,
		`{"text":["a","b"],"stream":true}`: true,
	} {
		_, err := VLLMPrefill([]byte(body))
		_, err2 := SGLangBody([]byte(body), Bootstrap{Host: "h"})
		if got := errors.Is(err, ErrBatch); got != batch || errors.Is(err2, ErrBatch) != batch {
			t.Errorf("%s: %v %v, want batch %v", body, err, err2, batch)
		}
	}
}

func TestHostOf(t *testing.T) {
	for id, want := range map[string]string{"http://10.0.0.5:30000": "10.0.0.5", "https://p.example/": "p.example", "http://[::1]:8": "::1", "nohost": ""} {
		got, err := HostOf(id)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("%s: %q %v", id, got, err)
		}
	}
}

func TestParseProtocol(t *testing.T) {
	for s, want := range map[string]Protocol{"": None, "off": None, "VLLM": VLLM, " sglang ": SGLang} {
		if got, err := ParseProtocol(s); err != nil || got != want {
			t.Errorf("%q: %v %v", s, got, err)
		}
	}
	if _, err := ParseProtocol("nixl"); err == nil {
		t.Error("nixl parses")
	}
}

// FuzzBodies: whatever a client sends, the legs' bodies are JSON objects
// with the protocol's fields, or an error; nothing panics.
func FuzzBodies(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"prompt":["a","b"]}`, `{"a":1,"a":2}`, `{}`, `[]`, `{"n":3}`, `{"x":"\u00e9"} `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if b, err := VLLMPrefill(body); err == nil {
			var m map[string]json.RawMessage
			if json.Unmarshal(b, &m) != nil || string(m["max_tokens"]) != "1" || string(m["kv_transfer_params"]) != string(vllmPrefillParams) {
				t.Fatalf("prefill body %s of %s", b, body)
			}
		}
		if b, err := VLLMDecode(body, json.RawMessage(`{"a":1}`)); err == nil {
			var m map[string]json.RawMessage
			if json.Unmarshal(b, &m) != nil || string(m["kv_transfer_params"]) != `{"a":1}` {
				t.Fatalf("decode body %s of %s", b, body)
			}
		}
		if b, err := SGLangBody(body, Bootstrap{Host: "h\"", Port: 1, Room: 2}); err == nil {
			var m map[string]json.RawMessage
			if json.Unmarshal(b, &m) != nil || string(m["bootstrap_room"]) != "2" || string(m["bootstrap_host"]) != `"h\""` {
				t.Fatalf("sglang body %s of %s", b, body)
			}
		}
	})
}

// FuzzVLLMParams: a prefill replica's answer (untrusted bytes) gives an
// object or nothing or an error; never a panic, never a non-object.
func FuzzVLLMParams(f *testing.F) {
	for _, s := range []string{`{"kv_transfer_params":{"remote_block_ids":[1],"remote_host":"h"}}`, `{"kv_transfer_params":null}`, `{}`, `x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		p, err := VLLMParams(answer)
		if err != nil || p == nil {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(p, &m) != nil {
			t.Fatalf("params %s of %s are not an object", p, answer)
		}
	})
}
