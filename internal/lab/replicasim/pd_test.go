package replicasim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pdPrompt is a prompt of many blocks.
var pdPrompt = strings.Repeat("a prompt worth a few blocks of KV. ", 40)

// ledgerOf waits for n entries in h's ledger and returns them.
func ledgerOf(t *testing.T, h *harness, n int) []LedgerEntry {
	t.Helper()
	eventually(t, "the ledger's entries", func() bool { return len(h.s.Ledger()) >= n })
	return h.s.Ledger()
}

// TestVLLMPrefillThenDecode: a prefill leg answers one token with
// kv_transfer_params naming its replica; the decode leg pulls the prompt
// from there (no prefill of those blocks) and reports them cached; the
// KV goes once: a second pull of it fails and its decode recomputes.
func TestVLLMPrefillThenDecode(t *testing.T) {
	pre := newHarness(t, Config{Role: RolePrefill, TimeScale: fast})
	dec := newHarness(t, Config{Role: RoleDecode, TimeScale: fast, DefaultMaxTokens: 8})
	resp := pre.post(context.Background(), "/v1/completions", map[string]any{"prompt": pdPrompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil}})
	var answer struct {
		Choices []struct{ Text string } `json:"choices"`
		Usage   usage                   `json:"usage"`
		KV      json.RawMessage         `json:"kv_transfer_params"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("prefill: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	var kv kvParams
	if err := json.Unmarshal(answer.KV, &kv); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(pre.ts.URL)
	if !kv.DoRemotePrefill || kv.DoRemoteDecode || kv.RemoteHost != u.Hostname() || strconv.Itoa(kv.RemotePort) != u.Port() ||
		kv.RemoteRequestID == "" || len(kv.RemoteBlockIDs) == 0 || answer.Usage.CompletionTokens != 1 || len(answer.Choices) != 1 {
		t.Fatalf("prefill answered %+v, params %+v", answer, kv)
	}
	decodeBody := map[string]any{"prompt": pdPrompt, "kv_transfer_params": json.RawMessage(answer.KV)}
	got := dec.generate("/v1/completions", decodeBody)
	prompt := answer.Usage.PromptTokens
	if got.Usage.PromptTokensDetails.CachedTokens < prompt-16 || got.Usage.CompletionTokens != 8 {
		t.Fatalf("decode usage %+v, prompt %d", got.Usage, prompt)
	}
	p, d := ledgerOf(t, pre, 1)[0], ledgerOf(t, dec, 1)[0]
	if p.Kind != "prefill" || p.Outcome != "ok" || p.ComputedTokens != prompt || d.Kind != "decode" || d.Outcome != "ok" ||
		d.PulledTokens < prompt-16 || d.ComputedTokens > 16 || d.CachedTokens != 0 {
		t.Fatalf("ledgers: prefill %+v decode %+v", p, d)
	}
	// Pulled once: a second decode of the same params recomputes.
	dec.generate("/v1/completions", decodeBody)
	if d := ledgerOf(t, dec, 2)[1]; d.Outcome != "pull_failed" || d.PulledTokens != 0 {
		t.Fatalf("second decode %+v", d)
	}
}

// TestSGLangRoom: the two legs of one room, sent at once, pair up: the
// decode claims the prefill's KV (waiting for its prefill), the prefill
// answers its one token once claimed; a prefill no decode claims within
// the hold answers 500, and so does a decode whose prefill never comes.
func TestSGLangRoom(t *testing.T) {
	pre := newHarness(t, Config{Role: RolePrefill, TimeScale: fast, KVHold: 300 * time.Millisecond})
	dec := newHarness(t, Config{Role: RoleDecode, TimeScale: fast, DefaultMaxTokens: 5, KVHold: 300 * time.Millisecond})
	u, _ := url.Parse(pre.ts.URL)
	port, _ := strconv.Atoi(u.Port())
	body := func(room int) map[string]any {
		return map[string]any{"messages": []map[string]any{{"role": "user", "content": pdPrompt}}, "stream": true,
			"bootstrap_host": u.Hostname(), "bootstrap_port": port, "bootstrap_room": room}
	}
	var wg sync.WaitGroup
	var prefill result
	wg.Go(func() { prefill = pre.generate("/v1/chat/completions", body(7)) })
	got := dec.generate("/v1/chat/completions", body(7))
	wg.Wait()
	if !got.Done || got.Usage != nil && got.Usage.CompletionTokens != 5 || !prefill.Done {
		t.Fatalf("decode %+v prefill %+v", got, prefill)
	}
	d := ledgerOf(t, dec, 1)[0]
	if d.Kind != "decode" || d.PulledTokens == 0 || d.Outcome != "ok" {
		t.Fatalf("decode ledger %+v", d)
	}
	// A room of its own for each leg: the decode's room must be one no
	// prefill ever computed (a prefill past its hold may still be claimed
	// by a decode that comes before its KV is dropped).
	for room, h := range map[int]*harness{8: pre, 9: dec} {
		resp := h.post(context.Background(), "/v1/chat/completions", body(room))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "error") {
			t.Errorf("an unpaired leg: %d %s", resp.StatusCode, b)
		}
	}
}

// TestRolesRefuseOtherLegs: a prefill replica serves prefill legs only,
// a decode replica decode legs only; a whole replica serves a whole
// request and an SGLang leg whole.
func TestRolesRefuseOtherLegs(t *testing.T) {
	whole := map[string]any{"prompt": "hi", "max_tokens": 2}
	for _, role := range []Role{RolePrefill, RoleDecode} {
		h := newHarness(t, Config{Role: role, TimeScale: fast})
		resp := h.post(context.Background(), "/v1/completions", whole)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), string(role)) {
			t.Errorf("%s replica, a whole request: %d %s", role, resp.StatusCode, b)
		}
	}
	h := newHarness(t, Config{TimeScale: fast})
	got := h.generate("/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 2, "bootstrap_host": "x", "bootstrap_port": 1, "bootstrap_room": 3})
	if got.Usage.CompletionTokens != 2 {
		t.Errorf("a whole replica's SGLang leg: %+v", got.Usage)
	}
	if _, err := ParseRole("router"); err == nil {
		t.Error("a bad role parses")
	}
}

// TestPrefillOnlyRequests: a prefill replica serves the two forms of a
// prefill no decode pulls (a router's prefill-only request) whole and
// caches the prompt: vLLM's, a plain request of one token, and SGLang's,
// its warm-up's fake bootstrap_host; a chat request without the
// generation prompt renders as a prefix of the conversation's next turn.
func TestPrefillOnlyRequests(t *testing.T) {
	for _, form := range []map[string]any{
		{"max_tokens": 1},
		{"max_tokens": 1, "bootstrap_host": fakeBootstrapHost, "bootstrap_room": 7},
	} {
		h := newHarness(t, Config{Role: RolePrefill, TimeScale: fast})
		msgs := []map[string]any{{"role": "user", "content": pdPrompt}, {"role": "assistant", "content": pdPrompt}}
		body := map[string]any{"messages": msgs, "add_generation_prompt": false}
		for k, v := range form {
			body[k] = v
		}
		if got := h.generate("/v1/chat/completions", body); got.Usage.CompletionTokens != 1 {
			t.Fatalf("%v: usage %+v", form, got.Usage)
		}
		next := map[string]any{"messages": append(msgs, map[string]any{"role": "user", "content": "and then?"}), "max_tokens": 1}
		for k, v := range form {
			if k != "max_tokens" {
				next[k] = v
			}
		}
		got := h.generate("/v1/chat/completions", next)
		// All but the next turn's last partial block and question.
		if c, p := got.Usage.PromptTokensDetails.CachedTokens, got.Usage.PromptTokens; c < p-32 {
			t.Errorf("%v: the next turn found %d of %d tokens cached", form, c, p)
		}
		if e := ledgerOf(t, h, 2)[0]; e.Kind != "whole" || e.Outcome != "ok" {
			t.Errorf("%v: served as %s %s", form, e.Kind, e.Outcome)
		}
	}
	// Any other bootstrap_host is a leg, held for its decode (at most
	// KVHold).
	h := newHarness(t, Config{Role: RolePrefill, TimeScale: fast, KVHold: 100 * time.Millisecond})
	resp := h.post(context.Background(), "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 1, "bootstrap_host": "10.0.0.1", "bootstrap_room": 7})
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Error("a prefill replica served an SGLang leg whole")
	}
}

// TestKVStoreBounds: a held prompt is released when its hold passes, a
// claim that no prefill answers gives up after the hold and leaves
// nothing behind, and the store holds at most maxTransfers.
func TestKVStoreBounds(t *testing.T) {
	k := newKVStore(20 * time.Millisecond)
	released := make(chan struct{})
	if k.register("a", 16, func() { close(released) }) == nil {
		t.Fatal("register refused")
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("a held prompt outlived its hold")
	}
	if _, err := k.claim(context.Background(), "a", true); err == nil {
		t.Fatal("claimed an expired prompt")
	}
	k.mu.Lock()
	n := len(k.entries)
	k.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d entries left", n)
	}
	big := newKVStore(time.Hour)
	defer big.close()
	for i := range maxTransfers {
		if big.register(strconv.Itoa(i), 1, func() {}) == nil {
			t.Fatalf("refused entry %d", i)
		}
	}
	if big.register("one more", 1, func() {}) != nil {
		t.Fatal("the store grew past its bound")
	}
}
