package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// respondsAs is a fake replica answering every request with name in its
// response, a Responses-shaped body or stream whose id names it too.
func respondsAs(name string, n *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		id := fmt.Sprintf("resp_%s_%d", name, n.Add(1))
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"%s","object":"response","model":"m","replica":"%s","output":[]}`, id, name)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"%s\",\"replica\":\"%s\"}}\n\n", id, name)
		w.(http.Flusher).Flush()
		fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":\"%s\"}}\n\n", id)
	}
}

// answer posts body to path and returns the response body, failing on a
// status other than 200.
func answer(t *testing.T, url, path, body string, header http.Header) string {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: status %d: %s", path, resp.StatusCode, got)
	}
	return got
}

func replicaIn(body string, names ...string) string {
	for _, n := range names {
		if strings.Contains(body, `"replica":"`+n+`"`) {
			return n
		}
	}
	return ""
}

// TestClientKeyPlacesAlikeWithoutGossip: two routers that share no summary
// (nothing gossiped; every replica claims no match) send requests with the
// same client key but different prompts to the same replica, for each kind
// of key; requests with different keys spread over the replicas.
func TestClientKeyPlacesAlikeWithoutGossip(t *testing.T) {
	var n atomic.Int64
	names := []string{"a", "b", "c", "d"}
	// The two routers see different loads (each counts only its own
	// requests), within the load bounds.
	var reps1, reps2 []fakeReplica
	for i, name := range names {
		id := newReplica(t, respondsAs(name, &n)).URL
		reps1 = append(reps1, fakeReplica{id: id, pending: float64(i)})
		reps2 = append(reps2, fakeReplica{id: id, pending: float64(len(names) - i)})
	}
	_, r1, _ := newTestProxy(t, newFakeView([]string{"m"}, reps1...), nil)
	_, r2, _ := newTestProxy(t, newFakeView([]string{"m"}, reps2...), func(c *Config) { c.SessionHeader = "X-Conversation" })
	prompt := func(i int) string { return strings.Repeat(fmt.Sprintf("prompt %d is different. ", i), 20) }
	tests := []struct {
		name string
		// request returns the body and headers of request i (1 or 2) with key k.
		request func(i int, k string) (string, http.Header)
		header  string // the second router's session header differs
	}{
		{"prompt_cache_key", func(i int, k string) (string, http.Header) {
			return fmt.Sprintf(`{"model":"m","prompt_cache_key":%q,"messages":[{"role":"user","content":%q}]}`, k, prompt(i)), nil
		}, ""},
		{"session header", func(i int, k string) (string, http.Header) {
			h := http.Header{}
			h.Set(DefaultSessionHeader, k)
			h.Set("X-Conversation", k)
			return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, prompt(i)), h
		}, ""},
		{"bootstrap_room", func(i int, k string) (string, http.Header) {
			return fmt.Sprintf(`{"model":"m","bootstrap_room":%d,"prompt":%q}`, len(k)*7919+int(k[len(k)-1]), prompt(i)), nil
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/chat/completions"
			if tc.name == "bootstrap_room" {
				path = "/v1/completions"
			}
			used := map[string]bool{}
			for k := range 12 {
				key := fmt.Sprintf("conversation-%d", k)
				b1, h1 := tc.request(1, key)
				b2, h2 := tc.request(2, key)
				first := replicaIn(answer(t, r1.URL, path, b1, h1), names...)
				second := replicaIn(answer(t, r2.URL, path, b2, h2), names...)
				if first == "" || first != second {
					t.Fatalf("key %s: router 1 sent it to %q, router 2 to %q", key, first, second)
				}
				used[first] = true
			}
			if len(used) < 2 {
				t.Fatalf("12 keys all went to %v: the key does not spread", used)
			}
		})
	}
}

// TestClientKeyPrecedence: prompt_cache_key wins over the session header,
// which wins over bootstrap_room.
func TestClientKeyPrecedence(t *testing.T) {
	p, _, _ := newTestProxy(t, newFakeView([]string{"m"}), nil)
	withHeader := func(v string) *http.Request {
		r, _ := http.NewRequest(http.MethodPost, "/", nil)
		if v != "" {
			r.Header.Set(DefaultSessionHeader, v)
		}
		return r
	}
	type keys struct{ cache, header, room string }
	key := func(k keys) uint64 {
		pr, err := chatAPI.render([]byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"x"}]%s%s}`,
			map[bool]string{true: fmt.Sprintf(`,"prompt_cache_key":%q`, k.cache)}[k.cache != ""],
			map[bool]string{true: `,"bootstrap_room":` + k.room}[k.room != ""])))
		if err != nil {
			t.Fatal(err)
		}
		return p.clientKey(withHeader(k.header), &pr)
	}
	if key(keys{}) != 0 {
		t.Fatal("a request without keys has a client key")
	}
	all := key(keys{"c", "h", "1"})
	if all != key(keys{cache: "c"}) || all == key(keys{header: "h", room: "1"}) {
		t.Error("prompt_cache_key does not take precedence")
	}
	if key(keys{header: "h", room: "1"}) != key(keys{header: "h"}) || key(keys{header: "h"}) == key(keys{room: "1"}) {
		t.Error("the session header does not take precedence over bootstrap_room")
	}
	if key(keys{cache: "x"}) == key(keys{header: "x"}) {
		t.Error("one value as two kinds of key collides")
	}
}

// TestPreviousResponseKeepsItsReplica: a Responses request naming an
// earlier response goes to the replica that produced it, even when the
// summaries now point elsewhere; an unknown id is routed as usual.
func TestPreviousResponseKeepsItsReplica(t *testing.T) {
	var n atomic.Int64
	a := newReplica(t, respondsAs("a", &n))
	b := newReplica(t, respondsAs("b", &n))
	view := newFakeView([]string{"m"}, fakeReplica{id: a.URL, match: 100}, fakeReplica{id: b.URL})
	p, srv, _ := newTestProxy(t, view, nil)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			view.mu.Lock()
			view.replicas[0].match, view.replicas[1].match = 100, 0
			view.mu.Unlock()
			first := answer(t, srv.URL, "/v1/responses", fmt.Sprintf(`{"model":"m","input":%q,"stream":%v}`, longPrompt, stream), nil)
			if replicaIn(first, "a", "b") != "a" {
				t.Fatalf("turn 1 did not follow the summaries to a: %s", first)
			}
			id, ok := findID([]byte(first[strings.Index(first, "{"):]))
			if !ok {
				t.Fatalf("no id in %s", first)
			}
			// Now b's summary claims everything; the id still pins to a.
			view.mu.Lock()
			view.replicas[0].match, view.replicas[1].match = 0, 100
			view.mu.Unlock()
			next := answer(t, srv.URL, "/v1/responses", fmt.Sprintf(`{"model":"m","input":"more","previous_response_id":%q,"stream":%v}`, id, stream), nil)
			if got := replicaIn(next, "a", "b"); got != "a" {
				t.Fatalf("turn 2 went to %q, want a, which holds %s", got, id)
			}
			other := answer(t, srv.URL, "/v1/responses", fmt.Sprintf(`{"model":"m","input":%q,"previous_response_id":"resp_unknown"}`, longPrompt), nil)
			if got := replicaIn(other, "a", "b"); got != "b" {
				t.Fatalf("an unknown previous response went to %q, want b (the summaries' choice)", got)
			}
		})
	}
	if got := testutil.ToFloat64(p.m.decisions.WithLabelValues(string(ReasonPreviousResponse))); got != 2 {
		t.Errorf("%v previous-response decisions, want 2", got)
	}
	if p.responses.len() != 6 {
		t.Errorf("%d response ids remembered, want 6", p.responses.len())
	}
}

func TestResponseLRUIsBounded(t *testing.T) {
	l := newResponseLRU(2)
	l.add("r1", "a")
	l.add("r2", "b")
	if _, ok := l.get("r1"); !ok { // r1 is now the most recent
		t.Fatal("r1 forgotten early")
	}
	l.add("r3", "c")
	if _, ok := l.get("r2"); ok {
		t.Error("the least recently used id was kept over the bound")
	}
	if rep, ok := l.get("r1"); !ok || rep != "a" {
		t.Errorf("r1 -> %q, %v; want a", rep, ok)
	}
	if l.len() != 2 {
		t.Errorf("%d entries, bound 2", l.len())
	}
}

func TestFindID(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{`{"id":"resp_1","object":"response"}`, "resp_1", true},
		{"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\" : \"resp_2\"", "resp_2", true},
		{`{"object":"id","id":"x"}`, "x", true},
		{`{"id":"resp_unfinished`, "", false},
		{`{"id":`, "", false},
		{`{"id":5}`, "", false},
		{`{"id":"a\"b"}`, "", false},
		{`{"object":"response"}`, "", false},
		{`{"object":"response","output":[{"id":"msg_1"}],"id":"resp_3"}`, "resp_3", true},
		{`{"note":"{\"id\":\"no\"}","id":"resp_4"}`, "resp_4", true},
		{`{"response":{"output":[],"id":"resp_5"`, "resp_5", true},
		{`{"id":""}`, "", false},
	}
	for _, tc := range tests {
		got, ok := findID([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("findID(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestEmbeddingsGoByLoad: embeddings go to the least loaded replica,
// whatever the summaries claim, pass through unchanged, and their answers
// are not read as completions.
func TestEmbeddingsGoByLoad(t *testing.T) {
	const reply = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-1]}],"model":"m","usage":{"prompt_tokens":3,"total_tokens":3}}`
	mk := func(name string) *replicaServer {
		return newReplica(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Replica", name)
			fmt.Fprint(w, reply)
		})
	}
	busy, idle := mk("busy"), mk("idle")
	view := newFakeView([]string{"m"}, fakeReplica{id: busy.URL, match: 100, inFlight: 5}, fakeReplica{id: idle.URL, inFlight: 1})
	p, srv, _ := newTestProxy(t, view, nil)
	for i := range 4 {
		resp := post(t, context.Background(), srv.URL+"/v1/embeddings", fmt.Sprintf(`{"model":"m","input":["text %d"]}`, i))
		body := readAll(t, resp)
		if resp.StatusCode != 200 || body != reply {
			t.Fatalf("status %d, body %q", resp.StatusCode, body)
		}
		if got := resp.Header.Get("X-Replica"); got != "idle" {
			t.Fatalf("request %d went to the %s replica", i, got)
		}
		view.waitDone(t)
	}
	if got := testutil.ToFloat64(p.m.decisions.WithLabelValues(string(ReasonLoad))); got != 4 {
		t.Errorf("%v load decisions, want 4", got)
	}
	if got := testutil.ToFloat64(p.m.promptTokens); got != 0 {
		t.Errorf("embedding answers were read: %v prompt tokens counted", got)
	}
	resp := post(t, context.Background(), srv.URL+"/v1/embeddings", `{"input":"x"}`)
	if readAll(t, resp); resp.StatusCode != 400 {
		t.Errorf("embeddings without a model: status %d", resp.StatusCode)
	}
}

func TestLeastLoaded(t *testing.T) {
	c := func(id string, tier, inFlight, waiting int) route.Candidate {
		return route.Candidate{Detail: &route.Detail{ID: id}, Tier: int8(tier), InFlight: int32(inFlight), EngineLoad: route.EngineLoad{Waiting: int32(waiting)}}
	}
	tests := []struct {
		name  string
		cands []route.Candidate
		want  string
	}{
		{"fewest in flight", []route.Candidate{c("a", 0, 3, 0), c("b", 0, 1, 9), c("c", 0, 2, 0)}, "b"},
		{"nearest tier first", []route.Candidate{c("far", 1, 0, 0), c("near", 0, 4, 0)}, "near"},
		{"then fewest waiting", []route.Candidate{c("a", 0, 1, 3), c("b", 0, 1, 2)}, "b"},
	}
	for _, tc := range tests {
		if d := leastLoaded(tc.cands, 0, []byte("x")); tc.cands[d.Index].ID() != tc.want || d.Reason != ReasonLoad {
			t.Errorf("%s: picked %s (%s), want %s", tc.name, tc.cands[d.Index].ID(), d.Reason, tc.want)
		}
	}
	// Equal replicas share the load: different bodies spread.
	eq := []route.Candidate{c("a", 0, 0, 0), c("b", 0, 0, 0), c("c", 0, 0, 0)}
	seen := map[int]bool{}
	for i := range 30 {
		seen[leastLoaded(eq, 0, fmt.Appendf(nil, "body %d", i)).Index] = true
	}
	if len(seen) != 3 {
		t.Errorf("30 bodies over 3 idle replicas used %d of them", len(seen))
	}
	// The order decodePick places by (byLoadOrder): a stale candidate's
	// counts are unknown, and an owned replica costs no hop.
	stale, owned := c("stale", 0, 0, 0), c("owned", 0, 1, 1)
	stale.Stale, owned.Detail.Local = true, true
	for key := range uint64(8) {
		if d := leastLoaded([]route.Candidate{stale, c("fresh", 0, 2, 2)}, key, nil); d.Index != 1 {
			t.Errorf("key %d: a stale candidate went before a fresh one", key)
		}
		if d := leastLoaded([]route.Candidate{c("remote", 0, 1, 1), owned}, key, nil); d.Index != 1 {
			t.Errorf("key %d: a remote replica went before an equal owned one", key)
		}
	}
}

// TestByLoadOneOrder: leastLoaded and decodePick place by the same
// order; only their reasons differ.
func TestByLoadOneOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		cands := make([]route.Candidate, 1+rng.IntN(6))
		for i := range cands {
			cands[i] = route.Candidate{Detail: &route.Detail{ID: fmt.Sprint("r", i), Local: rng.IntN(2) == 0},
				Tier: int8(rng.IntN(2)), Stale: rng.IntN(4) == 0, InFlight: int32(rng.IntN(3)),
				EngineLoad: route.EngineLoad{Waiting: int32(rng.IntN(3))}}
		}
		key := rng.Uint64() | 1
		l, d := leastLoaded(cands, key, nil), decodePick(cands, key)
		if l.Index != d.Index || l.Reason != ReasonLoad || d.Reason != ReasonDecode {
			t.Fatalf("round %d: leastLoaded %d (%s), decodePick %d (%s)", round, l.Index, l.Reason, d.Index, d.Reason)
		}
		for i := range cands { // nothing goes before the pick
			if i != l.Index && byLoadOrder(&cands[i], &cands[l.Index], mix64(route.HashID(cands[i].ID())^key), mix64(route.HashID(cands[l.Index].ID())^key)) < 0 {
				t.Fatalf("round %d: %s goes before the pick %s", round, cands[i].ID(), cands[l.Index].ID())
			}
		}
	}
}

// TestMessagesRouteLikeChat: an Anthropic Messages request is rendered,
// recorded at the replica and its SSE stream (event: lines) relayed as is.
func TestMessagesRouteLikeChat(t *testing.T) {
	const stream = "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, stream)
	})
	view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
	_, srv, _ := newTestProxy(t, view, nil)
	body := fmt.Sprintf(`{"model":"m","max_tokens":8,"stream":true,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":%q}]}]}`, longPrompt)
	resp := post(t, context.Background(), srv.URL+"/v1/messages", body)
	if got := readAll(t, resp); resp.StatusCode != 200 || got != stream {
		t.Fatalf("status %d, stream %q", resp.StatusCode, got)
	}
	view.waitDone(t)
	rec := view.recorded(rep.URL)
	if len(rec) == 0 || len(rec[0]) < len(longPrompt)/testContract.BlockBytes {
		t.Fatalf("the prompt's blocks were not recorded: %v", rec)
	}
	resp = post(t, context.Background(), srv.URL+"/v1/messages", `{"model":"m","messages":[]}`)
	if readAll(t, resp); resp.StatusCode != 400 {
		t.Errorf("empty messages: status %d", resp.StatusCode)
	}
}

// FuzzNewEndpoints sends arbitrary bodies through the whole request path of
// the Responses, Messages and embeddings endpoints.
func FuzzNewEndpoints(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":[{"role":"user","content":"x"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}],"previous_response_id":"resp_1","stream":true}`), uint8(0))
	f.Add([]byte(`{"model":"m","max_tokens":3,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"1"}]}]}`), uint8(1))
	f.Add([]byte(`{"model":"m","input":["a","b"],"prompt_cache_key":"k"}`), uint8(2))
	f.Add([]byte(`{"model":"other","input":"x"}`), uint8(0))
	view := newFakeView([]string{"m"}, fakeReplica{id: "http://a.invalid", match: 3}, fakeReplica{id: "http://b.invalid"}, fakeReplica{id: "http://c.invalid", owner: "http://peer.invalid"})
	close(view.dones)
	view.dones = nil
	p, err := New(Config{View: nopRecordView{view}, Policy: route.DefaultPolicy(), Contract: testContract,
		Client: &http.Client{Transport: cannedReplica{}}, MaxBodyBytes: 1 << 16, MaxResponses: 64})
	if err != nil {
		f.Fatal(err)
	}
	paths := []string{"/v1/responses", "/v1/messages", "/v1/embeddings"}
	f.Fuzz(func(t *testing.T, body []byte, which uint8) {
		path := paths[int(which)%len(paths)]
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(string(body)))
		r.Header.Set(DefaultSessionHeader, strings.ToValidUTF8(string(body[:min(len(body), 8)]), "?"))
		p.ServeHTTP(w, r)
		switch w.Code {
		case 200, 400, 404, 413:
		default:
			t.Fatalf("%s: status %d for %q: %s", path, w.Code, body, w.Body)
		}
		if p.responses.len() > 64 {
			t.Fatalf("%d response ids remembered over the bound 64", p.responses.len())
		}
	})
}

// TestResponseByIDGoesToItsReplica: retrieving, cancelling or deleting a
// stored response reaches the replica that produced it, directly or
// through its owner router; an id the router never saw is a 404.
func TestResponseByIDGoesToItsReplica(t *testing.T) {
	var n atomic.Int64
	type seen struct{ method, path, hop, replica string }
	got := make(chan seen, 16)
	handler := func(name string) http.HandlerFunc {
		inner := respondsAs(name, &n)
		return func(w http.ResponseWriter, r *http.Request) {
			got <- seen{r.Method, r.URL.Path, r.Header.Get(hop.HeaderHop), r.Header.Get(hop.HeaderReplica)}
			inner(w, r)
		}
	}
	a, b := newReplica(t, handler("a")), newReplica(t, handler("b"))
	// The owner router of remote replica b.
	ownerProxy, owner, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: b.URL}), func(c *Config) { c.HopKey = testHopKey })
	view := newFakeView([]string{"m"}, fakeReplica{id: a.URL, match: 100}, fakeReplica{id: b.URL, owner: owner.URL})
	p, srv, _ := newTestProxy(t, view, func(c *Config) { c.HopKey = testHopKey })
	p.responses.add("resp_at_a", a.URL)
	p.responses.add("resp_at_b", b.URL)
	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp)
	}
	tests := []struct {
		method, path string
		want         string // replica name
	}{
		{http.MethodGet, "/v1/responses/resp_at_a", "a"},
		{http.MethodGet, "/v1/responses/resp_at_a/input_items", "a"},
		{http.MethodDelete, "/v1/responses/resp_at_a", "a"},
		{http.MethodPost, "/v1/responses/resp_at_a/cancel", "a"},
		{http.MethodGet, "/v1/responses/resp_at_b", "b"}, // through its owner router
	}
	for _, tc := range tests {
		code, body := do(tc.method, tc.path)
		if code != 200 || replicaIn(body, "a", "b") != tc.want {
			t.Fatalf("%s %s: status %d, body %s; want replica %s", tc.method, tc.path, code, body, tc.want)
		}
		// Hints never leave the mesh: the replica sees the client's request.
		if s := recv(t, got, "the request at the replica"); s.method != tc.method || s.path != tc.path || s.hop != "" || s.replica != "" {
			t.Errorf("%s %s reached the replica as %+v", tc.method, tc.path, s)
		}
	}
	// Counted as the owner's handler ends, after its client had the body:
	// a hop, not a client's request (the entry router counted that).
	waitFor(t, "the owner's relay counted", func() bool {
		return testutil.ToFloat64(ownerProxy.m.hopRequests.WithLabelValues(epResponses, "200")) >= 1
	})
	if got := testutil.ToFloat64(ownerProxy.m.hopRequests.WithLabelValues(epResponses, "200")); got != 1 {
		t.Errorf("the owner router relayed %v requests for its replica's response, want 1", got)
	}
	if got := testutil.ToFloat64(ownerProxy.m.requests.WithLabelValues(epResponses, "200")); got != 0 {
		t.Errorf("the owner router counted %v hops as client requests, want 0", got)
	}
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/v1/responses/resp_never_seen", 404},
		{http.MethodPost, "/v1/responses/resp_at_a", 405},
		{http.MethodGet, "/v1/responses/resp_at_a/cancel", 405},
		{http.MethodGet, "/v1/responses/resp_at_a/other", 404},
	} {
		if code, body := do(tc.method, tc.path); code != tc.status {
			t.Errorf("%s %s: status %d (%s), want %d", tc.method, tc.path, code, body, tc.status)
		}
	}
	select {
	case s := <-got:
		t.Errorf("a refused request reached a replica: %+v", s)
	default:
	}
}
