package replicasim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Disaggregated prefill and decode, in both protocols a router speaks
// (kvmesh's proxy/disagg):
//
//   - vLLM (NIXL connector): a request whose kv_transfer_params says
//     do_remote_decode is a prefill: it computes the prompt, answers one
//     token with kv_transfer_params naming itself (remote_host and
//     remote_port: this server's address, remote_request_id: the
//     request), and keeps the prompt's blocks pinned until a decode pulls
//     them or KVHold passes. A request with do_remote_prefill is a decode:
//     it pulls the blocks it lacks from remote_host:remote_port (POST
//     /kvsim/pull), which costs TransferTokensPerS and no prefill, and
//     reports them as cached tokens, as vLLM counts a connector's tokens;
//     a pull that fails is recomputed (vLLM's kv_load_failure_policy
//     "recompute").
//   - SGLang: a request with bootstrap_host, bootstrap_port and
//     bootstrap_room is a prefill on a prefill replica: it computes the
//     prompt and holds its KV until the decode with the same room claims
//     it (POST /kvsim/pull at bootstrap_host:bootstrap_port), then
//     answers one token; unclaimed after KVHold, it answers 500. On a
//     decode replica it is a decode: it claims the room, waiting for the
//     prefill to finish (at most KVHold: then 500 before any output),
//     pulls, and generates. With SGLang's fake bootstrap_host (2.2.2.2,
//     its warm-up's) a prefill replica computes the prompt and answers
//     at once, the request served whole, as SGLang's fake KV sender does.
//
// How it differs from a real engine: the KV moves by HTTP between the
// simulators' own endpoints, and only its token count crosses (no
// tensors); the transfer time is tokens / TransferTokensPerS, with no
// contention between transfers; the bootstrap server is the engine's
// own HTTP port (SGLang's is a separate port, 8998 by default); a
// replica of role prefill or decode refuses requests that are not its
// leg (a real vLLM replica of either role serves whole requests too),
// so that a test sees a misrouted one, except that a prefill replica
// serves a whole request of one token (a router's prefill-only request); a whole replica (role both) takes
// either vLLM leg and serves an SGLang leg whole, ignoring its bootstrap
// fields, as SGLang's servers without a disaggregation mode do.

// Role is the part of disaggregated requests a replica serves.
type Role string

// The roles.
const (
	RoleBoth    Role = "both"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// ParseRole reads a --role value.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case "", RoleBoth:
		return RoleBoth, nil
	case RolePrefill, RoleDecode:
		return r, nil
	}
	return "", fmt.Errorf("role %q is not both, prefill or decode", s)
}

// pdMode is what one request is to this replica.
type pdMode int

const (
	modeWhole         pdMode = iota
	modePrefillVLLM          // a vLLM prefill: answer at once with kv_transfer_params
	modePrefillSGLang        // an SGLang prefill: hold the KV for its room's decode
	modeDecodeVLLM           // pull from remote_host:remote_port
	modeDecodeSGLang         // claim the room from bootstrap_host:bootstrap_port
)

func (m pdMode) kind() string {
	switch m {
	case modePrefillVLLM, modePrefillSGLang:
		return "prefill"
	case modeDecodeVLLM, modeDecodeSGLang:
		return "decode"
	}
	return "whole"
}

// pdFields is what a body says of disaggregation (request.go reads it).
type pdFields struct {
	KV            json.RawMessage `json:"kv_transfer_params"`
	BootstrapHost json.RawMessage `json:"bootstrap_host"`
	BootstrapPort json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom json.RawMessage `json:"bootstrap_room"`
}

// kvParams are the kv_transfer_params the simulator reads and writes.
type kvParams struct {
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	RemoteEngineID  string `json:"remote_engine_id,omitempty"`
	RemoteBlockIDs  []int  `json:"remote_block_ids,omitempty"`
	RemoteHost      string `json:"remote_host,omitempty"`
	RemotePort      int    `json:"remote_port,omitempty"`
	RemoteRequestID string `json:"remote_request_id,omitempty"`
	TPSize          int    `json:"tp_size,omitempty"`
}

// pdPlan is a request's disaggregation as this replica serves it: the
// mode, and where a decode pulls its KV (peer, the transfer's key).
type pdPlan struct {
	mode pdMode
	peer string // host:port of the prefill replica
	key  string // the transfer's key there
}

func isNull(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || bytes.Equal(b, []byte("null"))
}

// fakeBootstrapHost is the bootstrap_host SGLang's own warm-up sends a
// prefill server (FAKE_BOOTSTRAP_HOST): the prefill is computed and
// cached, and no decode server is waited for.
const fakeBootstrapHost = "2.2.2.2"

// plan reads f, of a request for maxTokens output tokens (0: unset), as
// a replica of role does.
func (f *pdFields) plan(role Role, maxTokens int) (pdPlan, error) {
	var p pdPlan
	switch {
	case !isNull(f.KV):
		var kv kvParams
		if err := json.Unmarshal(f.KV, &kv); err != nil {
			return p, badRequest("kv_transfer_params: %v", err)
		}
		switch {
		case kv.DoRemoteDecode:
			p.mode = modePrefillVLLM
		case kv.DoRemotePrefill:
			if kv.RemoteHost == "" || kv.RemotePort <= 0 || kv.RemotePort > 65535 || kv.RemoteRequestID == "" {
				return p, badRequest("kv_transfer_params: a remote prefill needs remote_host, remote_port and remote_request_id")
			}
			p.mode, p.peer, p.key = modeDecodeVLLM, net.JoinHostPort(kv.RemoteHost, strconv.Itoa(kv.RemotePort)), "vllm:"+kv.RemoteRequestID
		}
	case !isNull(f.BootstrapRoom) && role != RoleBoth:
		var room uint64
		var host string
		var port int
		if err := json.Unmarshal(f.BootstrapRoom, &room); err != nil {
			return p, badRequest("bootstrap_room: %v", err)
		}
		if err := json.Unmarshal(f.BootstrapHost, &host); err != nil || host == "" {
			return p, badRequest("bootstrap_host must be a host")
		}
		if host == fakeBootstrapHost && role == RolePrefill {
			return p, nil // a prefill that no decode pulls: served whole
		}
		p.mode, p.key = modePrefillSGLang, "room:"+strconv.FormatUint(room, 10)
		if role == RoleDecode {
			if err := json.Unmarshal(f.BootstrapPort, &port); err != nil || port <= 0 || port > 65535 {
				return p, badRequest("bootstrap_port must be the prefill server's bootstrap port")
			}
			p.mode, p.peer = modeDecodeSGLang, net.JoinHostPort(host, strconv.Itoa(port))
		}
	}
	switch {
	case role == RolePrefill && p.mode == modeWhole && maxTokens == 1 && isNull(f.BootstrapRoom):
		// A vLLM prefill replica serves whole requests too; one of
		// more than a token is refused, so that a test sees a client's
		// request misrouted to it.
	case role == RolePrefill && p.mode != modePrefillVLLM && p.mode != modePrefillSGLang:
		return p, badRequest("this replica's disaggregation mode is prefill: it serves prefill legs only")
	case role == RoleDecode && p.mode != modeDecodeVLLM && p.mode != modeDecodeSGLang:
		return p, badRequest("this replica's disaggregation mode is decode: it serves decode legs only")
	}
	return p, nil
}

// maxTransfers bounds the prompts a replica holds for decodes (and the
// claims waiting for one): beyond it a prefill is refused, as an engine
// out of KV blocks would.
const maxTransfers = 4096

// kvStore holds the prompts this replica prefilled for remote decodes,
// by key, until a decode pulls them or the hold passes.
type kvStore struct {
	mu      sync.Mutex
	entries map[string]*kvEntry
	hold    time.Duration
	closed  bool
}

type kvEntry struct {
	ready   chan struct{} // closed when the prefill registered it
	claimed chan struct{} // closed when a decode pulled it
	tokens  int
	release func() // unpins the blocks (once)
	timer   *time.Timer
}

func newKVStore(hold time.Duration) *kvStore {
	return &kvStore{entries: map[string]*kvEntry{}, hold: hold}
}

// entryLocked is key's entry, made when absent (nil when full).
func (k *kvStore) entryLocked(key string) *kvEntry {
	e := k.entries[key]
	if e == nil && len(k.entries) < maxTransfers && !k.closed {
		e = &kvEntry{ready: make(chan struct{}), claimed: make(chan struct{})}
		k.entries[key] = e
	}
	return e
}

// register offers tokens of prompt under key, pinned until released by
// release; unclaimed after the hold, they are released and the entry
// dropped. It returns the entry (nil: the store is full or closed).
func (k *kvStore) register(key string, tokens int, release func()) *kvEntry {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.entryLocked(key)
	if e == nil {
		return nil
	}
	select {
	case <-e.ready:
		return nil // registered twice: a duplicate key
	default:
	}
	e.tokens, e.release = tokens, sync.OnceFunc(release)
	close(e.ready)
	e.timer = time.AfterFunc(k.hold, func() { k.expire(key, e) })
	return e
}

// expire drops e, unclaimed, and unpins its blocks.
func (k *kvStore) expire(key string, e *kvEntry) {
	k.mu.Lock()
	if k.entries[key] == e {
		delete(k.entries, key)
	}
	k.mu.Unlock()
	if e.release != nil {
		e.release()
	}
}

// claim takes key's prompt, waiting for its prefill for at most the
// hold when wait (an SGLang room, whose decode may come first; a vLLM
// decode comes after its prefill answered): the tokens it held, which
// it no longer pins.
func (k *kvStore) claim(ctx context.Context, key string, wait bool) (int, error) {
	k.mu.Lock()
	e := k.entries[key]
	if wait {
		e = k.entryLocked(key)
	}
	k.mu.Unlock()
	if e == nil && !wait {
		return 0, fmt.Errorf("no prefill of %s held here", key)
	}
	if e == nil {
		return 0, fmt.Errorf("no room for a transfer")
	}
	t := time.NewTimer(k.hold)
	defer t.Stop()
	select {
	case <-e.ready:
	case <-ctx.Done():
		k.dropWaiter(key, e)
		return 0, ctx.Err()
	case <-t.C:
		k.dropWaiter(key, e)
		return 0, fmt.Errorf("no prefill of %s within %v", key, k.hold)
	}
	k.mu.Lock()
	if k.entries[key] != e {
		k.mu.Unlock()
		return 0, fmt.Errorf("the prefill of %s expired or was pulled", key)
	}
	delete(k.entries, key)
	k.mu.Unlock()
	e.timer.Stop()
	e.release()
	close(e.claimed)
	return e.tokens, nil
}

// dropWaiter removes an entry a claim made and no prefill registered.
func (k *kvStore) dropWaiter(key string, e *kvEntry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-e.ready:
	default:
		if k.entries[key] == e {
			delete(k.entries, key)
		}
	}
}

// close releases every held prompt (the server closes).
func (k *kvStore) close() {
	k.mu.Lock()
	k.closed = true
	entries := k.entries
	k.entries = map[string]*kvEntry{}
	k.mu.Unlock()
	for _, e := range entries {
		if e.timer != nil {
			e.timer.Stop()
		}
		if e.release != nil {
			e.release()
		}
	}
}

// pullRequest is POST /kvsim/pull's body; pullAnswer its answer.
type pullRequest struct {
	Key string `json:"key"`
}

type pullAnswer struct {
	Tokens int `json:"tokens"`
}

// servePull serves POST /kvsim/pull: a decode takes a prompt this
// replica prefilled (waiting for it, for an SGLang room).
func (s *Server) servePull(w http.ResponseWriter, r *http.Request) {
	var req pullRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&req); err != nil || req.Key == "" {
		writeError(w, http.StatusBadRequest, "a pull names its key")
		return
	}
	n, err := s.kv.claim(r.Context(), req.Key, strings.HasPrefix(req.Key, "room:"))
	if err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, pullAnswer{Tokens: n})
}

// pull takes plan's prompt from its prefill replica: the tokens it sent.
func (s *Server) pull(ctx context.Context, plan pdPlan) (int, error) {
	b, _ := json.Marshal(pullRequest{Key: plan.key})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+plan.peer+"/kvsim/pull", bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("pull from %s: %d %s", plan.peer, resp.StatusCode, bytes.TrimSpace(body))
	}
	var a pullAnswer
	if err := json.Unmarshal(body, &a); err != nil || a.Tokens < 0 {
		return 0, fmt.Errorf("pull from %s: %q", plan.peer, body)
	}
	return a.Tokens, nil
}

// vllmParams are the kv_transfer_params a vLLM prefill answers: this
// replica (its address as the request reached it) and the blocks held.
func vllmParams(host string, reqID string, blocks int) kvParams {
	h, p, err := net.SplitHostPort(host)
	port, _ := strconv.Atoi(p)
	if err != nil {
		h, port = host, 80
	}
	ids := make([]int, blocks)
	for i := range ids {
		ids[i] = i
	}
	return kvParams{DoRemotePrefill: true, RemoteEngineID: "kvsim-" + host, RemoteBlockIDs: ids,
		RemoteHost: h, RemotePort: port, RemoteRequestID: reqID, TPSize: 1}
}

// maxLedger bounds the requests a replica remembers (Ledger).
const maxLedger = 8192

// LedgerEntry is one request as the replica served it, for tests and the
// lab to count where each leg of a request went and what it computed.
type LedgerEntry struct {
	// RequestID is the request's X-Request-Id header ("" when none).
	RequestID string `json:"request_id"`
	// Kind is whole, prefill or decode.
	Kind string `json:"kind"`
	// PromptTokens, CachedTokens (this replica's own prefix cache hits),
	// PulledTokens (KV a decode took from its prefill replica) and
	// ComputedTokens (prefilled here).
	PromptTokens   int `json:"prompt_tokens"`
	BlockTokens    int `json:"block_tokens"` // the prompt's tokens in whole KV blocks: what a cache can hold of it
	CachedTokens   int `json:"cached_tokens"`
	PulledTokens   int `json:"pulled_tokens"`
	ComputedTokens int `json:"computed_tokens"`
	// Outcome is ok, error (answered an error), cancelled (the client
	// left before any output: nothing was generated), cut (the client
	// left, or the replica closed, after output began) or pull_failed (a
	// decode that recomputed its prompt, and answered).
	Outcome string `json:"outcome"`
}

// ledger keeps the last maxLedger entries.
type ledger struct {
	mu      sync.Mutex
	entries []LedgerEntry
	next    int
}

func (l *ledger) add(e LedgerEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) < maxLedger {
		l.entries = append(l.entries, e)
		return
	}
	l.entries[l.next] = e
	l.next = (l.next + 1) % maxLedger
}

// list is the entries, oldest first.
func (l *ledger) list() []LedgerEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]LedgerEntry, 0, len(l.entries))
	out = append(out, l.entries[l.next:]...)
	return append(out, l.entries[:l.next]...)
}

// Ledger returns the replica's recent requests (GET /kvsim/requests
// serves the same as JSON), oldest first.
func (s *Server) Ledger() []LedgerEntry { return s.ledger.list() }
