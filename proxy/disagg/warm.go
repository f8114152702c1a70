package disagg

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
)

// A prefill replica computes a turn's prompt but never sees its answer,
// which the decode replica generates: the next turn's prefill finds the
// previous prompt cached there and computes the answer again, on the
// turn's critical path. A warm request moves that work off it: once the
// answer is complete, the router sends the prefill replica the prompt
// followed by the answer, as a prefill no decode pulls, in the form each
// protocol's engines serve:
//
//	vLLM:   a plain request of one token (a replica with a KV connector
//	        serves one like any engine: no kv_transfer_params, nothing
//	        held for a remote decode);
//	SGLang: the prefill leg with bootstrap_host FakeBootstrapHost, the
//	        form of SGLang's own warm-up, which its prefill server
//	        computes and caches without waiting for a decode server.
//
// A chat request's warm renders the answer as an assistant message, as
// the next turn will; vLLM is asked not to open another assistant turn
// after it (add_generation_prompt false), so that the warm is a prefix
// of the next turn's prompt to the last token. SGLang opens one: its
// radix cache still shares everything up to it.

// FakeBootstrapHost is the bootstrap_host of SGLang's warm-up request
// (FAKE_BOOTSTRAP_HOST in sglang.srt.disaggregation.utils): its prefill
// server pairs the request with a KV sender that sends nothing.
const FakeBootstrapHost = "2.2.2.2"

// ErrNoWarm: the request's next turn cannot be told from its body (a
// token-id or batch prompt, a completion with a suffix, a chat request
// continuing its last message), or the answer is empty.
var ErrNoWarm = errors.New("no warm request for this body")

// noWarmFields are the client's fields a warm request drops: what shapes
// the output (a warm generates one token), and the legs' own.
var noWarmFields = []string{"stream_options", "max_completion_tokens", "min_tokens", "min_completion_tokens", "n", "best_of",
	"logprobs", "top_logprobs", "prompt_logprobs", "echo", "response_format", "guided_json", "guided_regex", "guided_choice",
	"guided_grammar", "structured_outputs", "kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"}

// WarmBody is the warm request of the client's body after its answer
// (the text of its first choice), for protocol proto (VLLM or SGLang);
// room is its bootstrap_room (SGLang). ErrNoWarm when there is none.
func WarmBody(proto Protocol, body []byte, answer string, room uint64) ([]byte, error) {
	if answer == "" || proto == None {
		return nil, ErrNoWarm
	}
	o, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	if err := o.single(); err != nil {
		return nil, err
	}
	if msgs := bytes.TrimSpace(o.get("messages")); len(msgs) > 0 {
		if isTrue(o.get("continue_final_message")) || isFalse(o.get("add_generation_prompt")) {
			return nil, ErrNoWarm // the answer continues a message the body ends with
		}
		var list []json.RawMessage
		if err := json.Unmarshal(msgs, &list); err != nil || len(list) == 0 {
			return nil, ErrNoWarm
		}
		content, _ := json.Marshal(answer)
		list = append(list, json.RawMessage(`{"role":"assistant","content":`+string(content)+`}`))
		v, err := json.Marshal(list)
		if err != nil {
			return nil, err
		}
		o.set("messages", v)
		if proto == VLLM {
			o.set("add_generation_prompt", json.RawMessage("false"))
		}
	} else {
		var prompt string
		if json.Unmarshal(o.get("prompt"), &prompt) != nil || o.has("suffix") && !isNull(o.get("suffix")) {
			return nil, ErrNoWarm
		}
		v, _ := json.Marshal(prompt + answer)
		o.set("prompt", v)
	}
	for _, k := range noWarmFields {
		o.del(k)
	}
	o.set("stream", json.RawMessage("false"))
	o.set("max_tokens", json.RawMessage("1"))
	if proto == SGLang {
		host, _ := json.Marshal(FakeBootstrapHost)
		o.set("bootstrap_host", host)
		o.set("bootstrap_room", strconv.AppendUint(nil, room&MaxRoom, 10))
	}
	return o.bytes(), nil
}

func isNull(v json.RawMessage) bool {
	v = bytes.TrimSpace(v)
	return len(v) == 0 || bytes.Equal(v, []byte("null"))
}

func isTrue(v json.RawMessage) bool  { return bytes.Equal(bytes.TrimSpace(v), []byte("true")) }
func isFalse(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("false")) }
