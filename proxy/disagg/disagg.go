// Package disagg holds the wire of the two prefill/decode disaggregation
// protocols a kvmesh router speaks to engines: what each leg's request
// body says, and what a prefill leg answers. It does no I/O and keeps no
// state; the orchestration of the legs is the proxy's (proxy/pd.go).
//
// vLLM (the NIXL connector's protocol, as vLLM's disaggregated proxy
// example, llm-d and Dynamo drive it): the prefill leg is the client's
// body with stream false, max_tokens 1 and kv_transfer_params
// {"do_remote_decode": true, "do_remote_prefill": false, "remote_...":
// null}; its JSON answer carries kv_transfer_params (remote_engine_id,
// remote_block_ids, remote_host, remote_port, ...), which the decode leg,
// the client's body otherwise unchanged, carries to a decode replica. The
// legs run one after the other.
//
// SGLang (as SGLang's router and SMG drive it): both legs are the client's
// body with bootstrap_host and bootstrap_port (the prefill replica's
// host and KV bootstrap port) and a random bootstrap_room, sent at once:
// the decode server pulls the KV from the prefill server's bootstrap
// endpoint under that room, and the client's answer is the decode's.
package disagg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"strconv"
	"strings"
)

// Protocol is the disaggregation protocol of a deployment.
type Protocol uint8

// The protocols.
const (
	// None: requests are not split; prefill and decode replicas serve
	// nothing (only whole replicas do).
	None Protocol = iota
	// VLLM: kv_transfer_params, prefill leg first (NIXL connector).
	VLLM
	// SGLang: bootstrap_host, bootstrap_port and bootstrap_room, both
	// legs at once.
	SGLang
)

// String is the protocol's flag spelling.
func (p Protocol) String() string {
	switch p {
	case VLLM:
		return "vllm"
	case SGLang:
		return "sglang"
	}
	return "off"
}

// ParseProtocol reads a --pd-protocol value: off (or ""), vllm or sglang.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "off", "none":
		return None, nil
	case "vllm":
		return VLLM, nil
	case "sglang":
		return SGLang, nil
	}
	return None, fmt.Errorf("disaggregation protocol %q is not off, vllm or sglang", s)
}

// ErrBatch: the body asks for several generations at once (n above 1, a
// batch of prompts), which neither protocol's single handover carries.
var ErrBatch = errors.New("a request for several generations (n above 1, or a batch of prompts) cannot be split into prefill and decode")

// object is a JSON object's members in order, each value as sent.
type object struct {
	keys []string
	vals []json.RawMessage
}

// parseObject reads body as one JSON object.
func parseObject(body []byte) (object, error) {
	var o object
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return o, fmt.Errorf("the body is not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return o, errors.New("the body is not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return o, fmt.Errorf("the body is not JSON: %w", err)
		}
		k, ok := tok.(string)
		if !ok {
			return o, errors.New("the body is not a JSON object")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return o, fmt.Errorf("the body is not JSON: %w", err)
		}
		o.keys, o.vals = append(o.keys, k), append(o.vals, v)
	}
	if _, err := dec.Token(); err != nil {
		return o, fmt.Errorf("the body is not JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return o, errors.New("the body has data after its JSON object")
	}
	return o, nil
}

// get is the value of key (its last occurrence, as encoding/json reads
// it), nil when absent.
func (o *object) get(key string) json.RawMessage {
	for i := len(o.keys) - 1; i >= 0; i-- {
		if o.keys[i] == key {
			return o.vals[i]
		}
	}
	return nil
}

// del removes every occurrence of key.
func (o *object) del(key string) {
	k, v := o.keys[:0], o.vals[:0]
	for i := range o.keys {
		if o.keys[i] != key {
			k, v = append(k, o.keys[i]), append(v, o.vals[i])
		}
	}
	o.keys, o.vals = k, v
}

// set gives key the value v: in place of its first occurrence (the
// others removed), else at the end.
func (o *object) set(key string, v json.RawMessage) {
	for i := range o.keys {
		if o.keys[i] == key {
			o.vals[i] = v
			rest := object{keys: o.keys[i+1:], vals: o.vals[i+1:]}
			rest.del(key)
			o.keys, o.vals = append(o.keys[:i+1], rest.keys...), append(o.vals[:i+1], rest.vals...)
			return
		}
	}
	o.keys, o.vals = append(o.keys, key), append(o.vals, v)
}

// has reports whether key is present.
func (o *object) has(key string) bool { return o.get(key) != nil }

// bytes encodes the object.
func (o *object) bytes() []byte {
	n := 2
	for i := range o.keys {
		n += len(o.keys[i]) + len(o.vals[i]) + 4
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i := range o.keys {
		if i > 0 {
			b = append(b, ',')
		}
		k, _ := json.Marshal(o.keys[i]) // a string always encodes
		b = append(append(append(b, k...), ':'), o.vals[i]...)
	}
	return append(b, '}')
}

// single reports ErrBatch for a body asking for several generations.
func (o *object) single() error {
	if n := bytes.TrimSpace(o.get("n")); len(n) > 0 && !bytes.Equal(n, []byte("null")) {
		v, err := strconv.ParseFloat(string(n), 64)
		if err != nil || v > 1 {
			return ErrBatch
		}
	}
	for _, key := range []string{"prompt", "input_ids", "text"} {
		var items []json.RawMessage
		if v := bytes.TrimSpace(o.get(key)); len(v) > 0 && v[0] == '[' && json.Unmarshal(v, &items) == nil && len(items) > 1 {
			// A list of token IDs is one prompt; a list of strings or
			// of lists, several.
			if f := bytes.TrimSpace(items[0]); len(f) > 0 && (f[0] == '"' || f[0] == '[') {
				return ErrBatch
			}
		}
	}
	return nil
}

// vllmPrefillParams is the kv_transfer_params of a vLLM prefill leg.
var vllmPrefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// VLLMPrefill is the body of a vLLM prefill leg for the client's body:
// no stream, one token, the request's KV kept for a remote decode. What
// vLLM refuses of a prefill-only request (min_tokens) is dropped; the
// decode leg keeps it.
func VLLMPrefill(body []byte) ([]byte, error) {
	o, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	if err := o.single(); err != nil {
		return nil, err
	}
	o.set("stream", json.RawMessage("false"))
	o.del("stream_options")
	o.set("max_tokens", json.RawMessage("1"))
	if o.has("max_completion_tokens") {
		o.set("max_completion_tokens", json.RawMessage("1"))
	}
	o.del("min_tokens")
	o.del("min_completion_tokens")
	o.set("kv_transfer_params", vllmPrefillParams)
	return o.bytes(), nil
}

// VLLMDecode is the body of a vLLM decode leg: the client's body with the
// kv_transfer_params its prefill leg answered. Without any (params nil:
// a prefill replica without a KV connector, or a prompt shorter than a
// block) the decode replica computes the prompt itself, as vLLM's own
// proxy does.
func VLLMDecode(body []byte, params json.RawMessage) ([]byte, error) {
	o, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	if len(params) == 0 {
		o.del("kv_transfer_params")
	} else {
		o.set("kv_transfer_params", params)
	}
	return o.bytes(), nil
}

// MaxPrefillAnswer bounds the prefill leg's answer that VLLMParams
// reads: remote_block_ids of a million-token prompt are under half a
// megabyte.
const MaxPrefillAnswer = 4 << 20

// VLLMParams reads the kv_transfer_params of a vLLM prefill leg's JSON
// answer: nil when it has none (or null), the object's bytes otherwise;
// an error when the answer is not a JSON object or its
// kv_transfer_params not an object.
func VLLMParams(answer []byte) (json.RawMessage, error) {
	if len(answer) > MaxPrefillAnswer {
		return nil, fmt.Errorf("the prefill answer is %d bytes, over %d", len(answer), MaxPrefillAnswer)
	}
	o, err := parseObject(answer)
	if err != nil {
		return nil, fmt.Errorf("prefill answer: %w", err)
	}
	v := bytes.TrimSpace(o.get("kv_transfer_params"))
	if len(v) == 0 || bytes.Equal(v, []byte("null")) {
		return nil, nil
	}
	if v[0] != '{' {
		return nil, errors.New("prefill answer: kv_transfer_params is not an object")
	}
	var b bytes.Buffer
	if err := json.Compact(&b, v); err != nil {
		return nil, fmt.Errorf("prefill answer: kv_transfer_params: %w", err)
	}
	return b.Bytes(), nil
}

// Bootstrap names a prefill replica to a decode server, SGLang's way:
// the host of the replica's URL, its KV bootstrap port (0: unknown,
// sent as null, which SGLang reads as its default), and the room
// pairing the two legs.
type Bootstrap struct {
	Host string
	Port uint16
	Room uint64
}

// MaxRoom is the largest bootstrap_room: SGLang draws rooms from
// [0, 2^63-1] (a signed 64-bit integer on its side).
const MaxRoom = math.MaxInt64

// HostOf is the bootstrap host of a replica whose base URL is id.
func HostOf(id string) (string, error) {
	u, err := url.Parse(id)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("replica %q has no host to bootstrap from", id)
	}
	return u.Hostname(), nil
}

// SGLangBody is the body of both legs of an SGLang request: the client's body
// with bs's bootstrap_host, bootstrap_port and bootstrap_room (the
// client's own, if any, replaced).
func SGLangBody(body []byte, bs Bootstrap) ([]byte, error) {
	o, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	if err := o.single(); err != nil {
		return nil, err
	}
	host, _ := json.Marshal(bs.Host)
	o.set("bootstrap_host", host)
	port := json.RawMessage("null")
	if bs.Port != 0 {
		port = strconv.AppendUint(nil, uint64(bs.Port), 10)
	}
	o.set("bootstrap_port", port)
	o.set("bootstrap_room", strconv.AppendUint(nil, bs.Room&MaxRoom, 10))
	return o.bytes(), nil
}
