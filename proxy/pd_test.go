package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/proxy/disagg"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/proxy/quota"
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// legBody reads a leg's body as a map.
func legBody(t *testing.T, r *http.Request) (map[string]json.RawMessage, []byte) {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Error(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Errorf("leg body %s: %v", b, err)
	}
	return m, b
}

// vllmPrefill is a fake vLLM prefill replica: it checks the leg's body
// and answers kv_transfer_params naming itself (engine name).
func vllmPrefill(t *testing.T, name string, status int) *replicaServer {
	return newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		m, b := legBody(t, r)
		if string(m["stream"]) != "false" || string(m["max_tokens"]) != "1" || !strings.Contains(string(m["kv_transfer_params"]), `"do_remote_decode":true`) {
			t.Errorf("prefill leg body %s", b)
		}
		if status != http.StatusOK {
			writeError(w, status, "prefill refused")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-p","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],`+
			`"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":0}},`+
			`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":%q,"remote_block_ids":[1,2],"remote_host":"h","remote_port":1}}`, name)
	})
}

func metricOf(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	return metricValue(t, reg, name, labels...)
}

// TestPDVLLM: a vLLM-protocol request goes first to the prefill replica
// holding its prefix (one token, no stream, do_remote_decode), then with
// that replica's kv_transfer_params to the decode replica, whose stream
// is the client's; both legs carry one X-Request-Id; the prefill
// replica is recorded as holding the prompt, not the answer, and the
// decode replica nothing.
func TestPDVLLM(t *testing.T) {
	cold := vllmPrefill(t, "cold", http.StatusOK)
	warm := vllmPrefill(t, "warm", http.StatusOK)
	// A whole replica may take either leg; this one holds nothing.
	whole := newReplica(t, func(w http.ResponseWriter, r *http.Request) { t.Error("a whole replica holding nothing got a leg") })
	decode := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		m, b := legBody(t, r)
		if string(m["stream"]) != "true" || !strings.Contains(string(m["kv_transfer_params"]), `"remote_engine_id":"warm"`) {
			t.Errorf("decode leg body %s", b)
		}
		sseChat(w, []string{"decoded", " answer"}, 96)
	})
	view := newFakeView([]string{"m"},
		fakeReplica{id: cold.URL, role: route.RolePrefill},
		fakeReplica{id: warm.URL, role: route.RolePrefill, match: 20},
		fakeReplica{id: decode.URL, role: route.RoleDecode},
		fakeReplica{id: whole.URL, inFlight: 3})
	_, srv, reg := newTestProxy(t, view, func(c *Config) { c.PD = disagg.VLLM })
	body := readAll(t, post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("m", true, strings.Repeat("a long prompt ", 20))))
	if !strings.Contains(body, "decoded") || !strings.Contains(body, "[DONE]") {
		t.Fatalf("client got %q", body)
	}
	if warm.count() != 1 || cold.count() != 0 || decode.count() != 1 {
		t.Fatalf("prefill warm %d cold %d, decode %d", warm.count(), cold.count(), decode.count())
	}
	if a, b := warm.headers[0].Get(HeaderRequestID), decode.headers[0].Get(HeaderRequestID); a == "" || a != b {
		t.Errorf("request ids %q and %q", a, b)
	}
	waitCounted(t, srv.Config.Handler.(*Proxy), epChat, 1)
	// The prompt on acceptance, and again after the engine reported
	// fewer cached tokens than the summary claimed (learn): never more.
	recs := view.recorded(warm.URL)
	for _, r := range recs {
		if len(r) != len(recs[0]) {
			t.Errorf("the prefill replica recorded %d blocks, then %d: the answer too", len(recs[0]), len(r))
		}
	}
	if len(recs) == 0 || len(view.recorded(decode.URL)) != 0 {
		t.Errorf("recorded prefill %d times, decode %d", len(recs), len(view.recorded(decode.URL)))
	}
	if got := metricOf(t, reg, "kvmesh_pd_requests_total", pdOK, "vllm"); got != 1 {
		t.Errorf("pd ok = %v", got)
	}
	if got := metricOf(t, reg, "kvmesh_route_decisions_total", string(ReasonDecode)); got != 1 {
		t.Errorf("decode decisions = %v", got)
	}
}

// TestPDVLLMPrefillRetry: a prefill leg that fails before any output (a
// refused dial, then a 500 after the request was sent) is tried on the
// next prefill replica; the decode leg runs once, with the params of the
// prefill that answered. A client error of the prefill replica's is the
// client's, and no decode leg runs.
func TestPDVLLMPrefillRetry(t *testing.T) {
	broken := vllmPrefill(t, "broken", http.StatusInternalServerError)
	good := vllmPrefill(t, "good", http.StatusOK)
	decode := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		m, b := legBody(t, r)
		if !strings.Contains(string(m["kv_transfer_params"]), `"remote_engine_id":"good"`) {
			t.Errorf("decode leg body %s", b)
		}
		jsonChat(w, "decoded", 90)
	})
	view := newFakeView([]string{"m"},
		fakeReplica{id: deadAddr(t), role: route.RolePrefill, match: 30},
		fakeReplica{id: broken.URL, role: route.RolePrefill, match: 20},
		fakeReplica{id: good.URL, role: route.RolePrefill},
		fakeReplica{id: decode.URL, role: route.RoleDecode})
	_, srv, reg := newTestProxy(t, view, func(c *Config) { c.PD = disagg.VLLM; c.MaxAttempts = 4 })
	resp := post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("m", false, strings.Repeat("prompt ", 20)))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "decoded") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if broken.count() != 1 || good.count() != 1 || decode.count() != 1 {
		t.Fatalf("broken %d good %d decode %d", broken.count(), good.count(), decode.count())
	}
	if got := metricOf(t, reg, "kvmesh_pd_leg_rounds_total", "prefill", "retried"); got != 1 {
		t.Errorf("prefill rounds retried = %v", got)
	}

	// Every prefill replica failing: 502, saying which leg and why.
	view = newFakeView([]string{"m"}, fakeReplica{id: broken.URL, role: route.RolePrefill}, fakeReplica{id: decode.URL, role: route.RoleDecode})
	_, srv, _ = newTestProxy(t, view, func(c *Config) { c.PD = disagg.VLLM })
	resp = post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("m", false, "hello"))
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "prefill leg") || !strings.Contains(body, "answered 500: prefill refused") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}

	bad := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusBadRequest, "This model's maximum context length is 8 tokens.")
	})
	view = newFakeView([]string{"m"}, fakeReplica{id: bad.URL, role: route.RolePrefill}, fakeReplica{id: decode.URL, role: route.RoleDecode})
	_, srv, _ = newTestProxy(t, view, func(c *Config) { c.PD = disagg.VLLM })
	resp = post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("m", true, "hello"))
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "maximum context length") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if decode.count() != 1 {
		t.Fatalf("a decode leg ran after a failed prefill (%d)", decode.count())
	}
}

// TestPDVLLMDecodeNotReached: a decode replica that refuses the
// connection is skipped for the next one, with the same params (the
// prefill replica keeps the KV for whoever pulls it).
func TestPDVLLMDecodeNotReached(t *testing.T) {
	pre := vllmPrefill(t, "p", http.StatusOK)
	decode := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, []string{"ok"}, 90) })
	dead := deadAddr(t)
	view := newFakeView([]string{"m"},
		fakeReplica{id: pre.URL, role: route.RolePrefill},
		fakeReplica{id: dead, role: route.RoleDecode},
		fakeReplica{id: decode.URL, role: route.RoleDecode, inFlight: 5}) // the dead one looks idler
	_, srv, _ := newTestProxy(t, view, func(c *Config) { c.PD = disagg.VLLM })
	resp := post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("m", true, "hello there"))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"ok"`) {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if pre.count() != 1 || decode.count() != 1 {
		t.Fatalf("prefill %d decode %d", pre.count(), decode.count())
	}
}

// rooms is what fake SGLang replicas share: the rooms whose KV a
// prefill replica has, so a decode replica waits for its room as SGLang's
// does.
type rooms struct {
	mu    sync.Mutex
	ready map[string]chan struct{}
}

func (rs *rooms) of(room string) chan struct{} {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.ready == nil {
		rs.ready = map[string]chan struct{}{}
	}
	if rs.ready[room] == nil {
		rs.ready[room] = make(chan struct{})
	}
	return rs.ready[room]
}

// sglangPair is fake SGLang prefill and decode replicas over shared
// rooms; a prefill replica with status other than 200 refuses.
func sglangPrefill(t *testing.T, rs *rooms, status int, seen chan<- map[string]json.RawMessage) *replicaServer {
	return newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		m, _ := legBody(t, r)
		seen <- m
		if status != http.StatusOK {
			// Once the decode leg is in flight, so that it must be
			// cancelled (were it not, the round would end before it).
			recv(t, rs.of("arrived "+string(m["bootstrap_room"])), "the decode leg of a refused prefill")
			writeError(w, status, "prefill refused")
			return
		}
		close(rs.of(string(m["bootstrap_room"])))
		jsonChat(w, "x", 0)
	})
}

// TestPDSGLang: both legs carry the prefill replica's host and bootstrap
// port and one room, sent at once; the decode replica's stream is the
// client's. A prefill replica that refuses abandons its round (the
// decode leg waiting for its KV is cancelled, having sent nothing) and
// the next round pairs another prefill replica under a new room: the
// client gets one answer.
func TestPDSGLang(t *testing.T) {
	rs := &rooms{}
	seen := make(chan map[string]json.RawMessage, 8)
	refusing := sglangPrefill(t, rs, http.StatusServiceUnavailable, seen)
	good := sglangPrefill(t, rs, http.StatusOK, seen)
	var mu sync.Mutex
	var decodeRooms []string
	cancelled := make(chan string, 4)
	decode := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		m, _ := legBody(t, r)
		room := string(m["bootstrap_room"])
		mu.Lock()
		decodeRooms = append(decodeRooms, room)
		mu.Unlock()
		close(rs.of("arrived " + room))
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // SGLang sends its head at once
		select {
		case <-rs.of(room):
			sseChat(w, []string{"decoded"}, 96)
		case <-r.Context().Done():
			cancelled <- room
		}
	})
	view := newFakeView([]string{"m"},
		fakeReplica{id: refusing.URL, role: route.RolePrefill, match: 20, boot: 8998},
		fakeReplica{id: good.URL, role: route.RolePrefill, boot: 9001},
		fakeReplica{id: decode.URL, role: route.RoleDecode})
	_, srv, reg := newTestProxy(t, view, func(c *Config) { c.PD = disagg.SGLang })
	resp := post(t, context.Background(), srv.URL+"/v1/chat/completions", chatBody("m", true, strings.Repeat("prompt ", 30)))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || strings.Count(body, "decoded") != 1 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("status %d: %q", resp.StatusCode, body)
	}
	first, second := recv(t, seen, "the first prefill leg"), recv(t, seen, "the second prefill leg")
	u1, _ := url.Parse(refusing.URL)
	u2, _ := url.Parse(good.URL)
	if string(first["bootstrap_host"]) != `"`+u1.Hostname()+`"` || string(first["bootstrap_port"]) != "8998" ||
		string(second["bootstrap_host"]) != `"`+u2.Hostname()+`"` || string(second["bootstrap_port"]) != "9001" {
		t.Errorf("bootstrap fields %s:%s then %s:%s", first["bootstrap_host"], first["bootstrap_port"], second["bootstrap_host"], second["bootstrap_port"])
	}
	if string(first["bootstrap_room"]) == string(second["bootstrap_room"]) {
		t.Error("the second round reused the first's room")
	}
	if got := recv(t, cancelled, "the abandoned decode leg to be cancelled"); got != string(first["bootstrap_room"]) {
		t.Errorf("cancelled the decode leg of room %s, want %s", got, first["bootstrap_room"])
	}
	mu.Lock()
	if len(decodeRooms) != 2 || decodeRooms[1] != string(second["bootstrap_room"]) {
		t.Errorf("decode legs of rooms %v", decodeRooms)
	}
	mu.Unlock()
	if got := metricOf(t, reg, "kvmesh_pd_leg_rounds_total", "prefill", "retried"); got != 1 {
		t.Errorf("prefill rounds retried = %v", got)
	}
	waitCounted(t, srv.Config.Handler.(*Proxy), epChat, 1)
	if got := metricOf(t, reg, "kvmesh_pd_requests_total", pdOK, "sglang"); got != 1 {
		t.Errorf("pd ok = %v", got)
	}
}

// TestPDClientGone: a client that leaves mid-stream ends both legs: the
// decode leg's stream and an SGLang prefill leg still waiting for its
// decode (which never claims the KV here).
func TestPDClientGone(t *testing.T) {
	prefillGone, decodeGone := make(chan struct{}), make(chan struct{})
	started, preStarted := make(chan struct{}), make(chan struct{})
	pre := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		legBody(t, r) // read to its end: net/http then watches the connection
		close(preStarted)
		<-r.Context().Done() // holds the KV until claimed: never
		close(prefillGone)
	})
	decode := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		legBody(t, r)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
		close(decodeGone)
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: pre.URL, role: route.RolePrefill}, fakeReplica{id: decode.URL, role: route.RoleDecode})
	p, srv, reg := newTestProxy(t, view, func(c *Config) { c.PD = disagg.SGLang })
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", true, "hi")))
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	recv(t, started, "the decode leg")
	// Both legs at their replicas (SGLang sends them at once, and a
	// prefill leg not yet sent when the client leaves is never sent).
	recv(t, preStarted, "the prefill leg")
	cancel()
	recv(t, prefillGone, "the prefill leg to be cancelled")
	recv(t, decodeGone, "the decode leg to be cancelled")
	waitCounted(t, p, epChat, 1)
	if got := metricOf(t, reg, "kvmesh_pd_requests_total", pdClientGone, "sglang"); got != 1 {
		t.Errorf("pd client_gone = %v", got)
	}
}

// TestPDRolesOfWholeRequests: with no protocol, or for an endpoint no
// protocol splits, only whole replicas serve; a batch of prompts is
// served whole, and refused (400) where no whole replica exists.
func TestPDRolesOfWholeRequests(t *testing.T) {
	whole := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "whole", 0) })
	pre := newReplica(t, func(w http.ResponseWriter, r *http.Request) { t.Error("a prefill replica got a whole request") })
	decode := newReplica(t, func(w http.ResponseWriter, r *http.Request) { t.Error("a decode replica got a whole request") })
	view := newFakeView([]string{"m"},
		fakeReplica{id: pre.URL, role: route.RolePrefill, match: 30},
		fakeReplica{id: decode.URL, role: route.RoleDecode},
		fakeReplica{id: whole.URL})
	for _, proto := range []disagg.Protocol{disagg.None, disagg.VLLM} {
		_, srv, _ := newTestProxy(t, view, func(c *Config) { c.PD = proto })
		for path, body := range map[string]string{
			"/v1/chat/completions": chatBody("m", false, "hi"),
			"/v1/completions":      `{"model":"m","prompt":["a","b"]}`,
			"/v1/messages":         `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		} {
			if proto != disagg.None && path == "/v1/chat/completions" {
				continue // split: whole has no role there
			}
			resp := post(t, context.Background(), srv.URL+path, body)
			if got := readAll(t, resp); resp.StatusCode != http.StatusOK {
				t.Errorf("%v %s: %d %s", proto, path, resp.StatusCode, got)
			}
		}
	}
	view = newFakeView([]string{"m"}, fakeReplica{id: pre.URL, role: route.RolePrefill}, fakeReplica{id: decode.URL, role: route.RoleDecode})
	_, srv, _ := newTestProxy(t, view, func(c *Config) { c.PD = disagg.SGLang })
	resp := post(t, context.Background(), srv.URL+"/v1/completions", `{"model":"m","prompt":["a","b"]}`)
	if got := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(got, "several generations") {
		t.Errorf("a batch without whole replicas: %d %s", resp.StatusCode, got)
	}
}

// TestOwnCandidatesOfLegs: an owner keeps a leg's candidates of its role,
// and a pinned leg's hinted replica alone, whatever its load.
func TestOwnCandidatesOfLegs(t *testing.T) {
	cands := []route.Candidate{
		{Detail: &route.Detail{ID: "p1", Local: true}, Role: route.RolePrefill, InFlight: 50, EngineLoad: route.EngineLoad{Slots: 1}},
		{Detail: &route.Detail{ID: "p2", Local: true}, Role: route.RolePrefill},
		{Detail: &route.Detail{ID: "d1", Local: true}, Role: route.RoleDecode},
		{Detail: &route.Detail{ID: "w1", Local: true}},
	}
	ids := func(cs []route.Candidate) string {
		var s []string
		for _, c := range cs {
			s = append(s, c.ID())
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		leg      hop.Leg
		want     string
		wantHint int
	}{
		{hop.LegNone, "w1", -1},
		{hop.LegPrefill, "p1,p2,w1", -1}, // p1 is too busy to keep
		{hop.LegPinned, "p1", 0},
		{hop.LegDecode, "d1,w1", -1},
	} {
		if tc.leg != hop.LegNone && tc.leg != hop.LegPinned {
			// SGLang's: only the leg's own role.
			strict := fitRole(append([]route.Candidate(nil), cands...), tc.leg, false, true)
			if got := ids(strict); strings.Contains(got, "w1") {
				t.Errorf("leg %q, strict: %s", tc.leg, got)
			}
		}
		in := fitRole(append([]route.Candidate(nil), cands...), tc.leg, false, false)
		got, hint := ownCandidates(route.DefaultPolicy(), in, "p1", tc.leg == hop.LegPinned)
		if ids(got) != tc.want || hint != tc.wantHint {
			t.Errorf("leg %q: %s hint %d, want %s hint %d", tc.leg, ids(got), hint, tc.want, tc.wantHint)
		}
	}
}

// TestDecodePick: nearest tier, then fresh, then fewest in flight, then
// fewest waiting, then owned; its reason is pd-decode.
func TestDecodePick(t *testing.T) {
	c := func(id string, tier int8, stale bool, inFlight, waiting int32, local bool) route.Candidate {
		return route.Candidate{Detail: &route.Detail{ID: id, Local: local}, Tier: tier, Stale: stale, InFlight: inFlight,
			EngineLoad: route.EngineLoad{Waiting: waiting, HasLoad: true}}
	}
	for _, tc := range []struct {
		cands []route.Candidate
		want  string
	}{
		{[]route.Candidate{c("far", 1, false, 0, 0, true), c("near", 0, false, 9, 9, false)}, "near"},
		{[]route.Candidate{c("stale", 0, true, 0, 0, true), c("fresh", 0, false, 3, 3, false)}, "fresh"},
		{[]route.Candidate{c("busy", 0, false, 4, 0, true), c("idle", 0, false, 1, 5, false)}, "idle"},
		{[]route.Candidate{c("queued", 0, false, 1, 3, true), c("free", 0, false, 1, 0, false)}, "free"},
		{[]route.Candidate{c("remote", 0, false, 1, 1, false), c("owned", 0, false, 1, 1, true)}, "owned"},
	} {
		for key := range uint64(4) {
			d := decodePick(tc.cands, key)
			if got := tc.cands[d.Index].ID(); got != tc.want || d.Reason != ReasonDecode {
				t.Errorf("key %d: %s (%s), want %s", key, got, d.Reason, tc.want)
			}
		}
	}
}

// The metrics of split requests are pre-initialised, under the
// deployment's protocol.
func TestPDMetricsInitialised(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	newPDMetrics(reg, disagg.SGLang)
	if n := testutil.CollectAndCount(reg, "kvmesh_pd_requests_total"); n != 6 {
		t.Errorf("%d series", n)
	}
	if v := testutil.ToFloat64(newPDMetrics(prometheus.NewRegistry(), disagg.None).requests.WithLabelValues("off", pdOK)); v != 0 {
		t.Errorf("off: %v", v)
	}
}

// TestOwnerOfADeadReplicaRefuses: an owner whose replica refuses the
// connection (dead before its health checks noticed) answers the hop
// 503, not dispatched, so the entry takes another replica: the client
// is answered (a decode replica killed mid-stream costs no other
// request). A client of that owner gets 502 as before.
func TestOwnerOfADeadReplicaRefuses(t *testing.T) {
	dead := deadAddr(t)
	_, owner, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: dead}), func(c *Config) { c.HopKey = testHopKey })
	alive := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from the other", 0) })
	view := newFakeView([]string{"m"}, fakeReplica{id: dead, owner: owner.URL, match: 20}, fakeReplica{id: alive.URL})
	_, entry, _ := newTestProxy(t, view, func(c *Config) { c.HopKey = testHopKey })
	resp := post(t, context.Background(), entry.URL+"/v1/chat/completions", chatBody("m", false, strings.Repeat("prompt ", 20)))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "from the other") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	resp = post(t, context.Background(), owner.URL+"/v1/chat/completions", chatBody("m", false, "hi"))
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("a client of the owner: status %d: %s", resp.StatusCode, body)
	}
}

// TestPDChargesTheDecodeLegsUsage: a split request is charged to its
// tenant what its decode leg's engine reported (the answer is the
// decode's), not left at its input estimate.
func TestPDChargesTheDecodeLegsUsage(t *testing.T) {
	pre := vllmPrefill(t, "p", http.StatusOK)
	for _, owned := range []bool{true, false} {
		dec := newReplica(t, usageChat(100, 20))
		fr := fakeReplica{id: dec.URL, role: route.RoleDecode}
		if !owned {
			fr = fakeReplica{id: "http://decode-of-b", owner: dec.URL, role: route.RoleDecode}
		}
		l, err := quota.New(quota.Config{Default: quota.Limit{Input: 1e6, Output: 1e6}})
		if err != nil {
			t.Fatal(err)
		}
		view := newFakeView([]string{"m"}, fakeReplica{id: pre.URL, role: route.RolePrefill}, fr)
		_, srv, _ := newTestProxy(t, view, func(c *Config) { c.PD, c.Quota = disagg.VLLM, l })
		if resp, b := postTenant(t, srv.URL, "a", chatBody("m", false, "hello")); resp.StatusCode != 200 {
			t.Fatalf("owned %v: %d %s", owned, resp.StatusCode, b)
		}
		waitCounted(t, srv.Config.Handler.(*Proxy), epChat, 1)
		if st := l.Status(1); len(st.Tenants) != 1 || st.Tenants[0].Input != 100 || st.Tenants[0].Output != 20 {
			t.Fatalf("owned %v: charged %+v, want the decode's 100 in, 20 out", owned, st)
		}
	}
}
