package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/proxy/quota"
)

// usageChat answers a chat completion with the given usage.
func usageChat(prompt, completion int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "ok"}}},
			"usage":   map[string]any{"prompt_tokens": prompt, "completion_tokens": completion},
		})
	}
}

func postTenant(t *testing.T, url, tenant, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Kvmesh-Tenant", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, readAll(t, resp)
}

// TestTenantTokenBudget: a tenant's requests are charged the engine's
// reported usage; once its input budget is spent it gets 429
// rate_limit_exceeded (type tokens) with Retry-After, before any replica
// sees the request, while another tenant is served.
func TestTenantTokenBudget(t *testing.T) {
	for _, owned := range []bool{true, false} {
		rep := newReplica(t, usageChat(100, 20))
		fr := fakeReplica{id: rep.URL}
		if !owned {
			// Another router owns it: the request hops there, and this
			// router reads the usage from the owner's relay.
			fr = fakeReplica{id: "http://replica-of-b", owner: rep.URL}
		}
		var l *quota.Ledger
		_, srv, reg := newTestProxy(t, newFakeView([]string{"m"}, fr), func(c *Config) {
			var err error
			l, err = quota.New(quota.Config{Default: quota.Limit{Input: 250}, Tenants: map[uint64]quota.Tenant{
				TenantKeys("b")[1]: {Name: "b", Limit: quota.Limit{Input: 1e6}}}, Registerer: c.Registerer})
			if err != nil {
				t.Fatal(err)
			}
			c.Quota = l
		})
		body := chatBody("m", false, "hello")
		for i := range 3 {
			if resp, b := postTenant(t, srv.URL, "a", body); resp.StatusCode != 200 {
				t.Fatalf("owned %v: request %d: %d %s", owned, i, resp.StatusCode, b)
			}
		}
		resp, b := postTenant(t, srv.URL, "a", body)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
			resp.Header.Get("X-Ratelimit-Limit-Tokens") != "250" {
			t.Fatalf("owned %v: over budget: %d %v %s", owned, resp.StatusCode, resp.Header, b)
		}
		var e struct {
			Error struct{ Type, Code, Message string }
		}
		if err := json.Unmarshal([]byte(b), &e); err != nil || e.Error.Code != "rate_limit_exceeded" || e.Error.Type != "tokens" {
			t.Fatalf("owned %v: error %s", owned, b)
		}
		if rep.count() != 3 {
			t.Fatalf("owned %v: the replica saw %d requests", owned, rep.count())
		}
		if resp, b := postTenant(t, srv.URL, "b", body); resp.StatusCode != 200 {
			t.Fatalf("owned %v: another tenant: %d %s", owned, resp.StatusCode, b)
		}
		in := metricValue(t, reg, "kvmesh_tenant_tokens_total", "input", "other")
		out := metricValue(t, reg, "kvmesh_tenant_tokens_total", "output", "other")
		rej := metricValue(t, reg, "kvmesh_tenant_rejections_total", "input", "other")
		if in != 300 || out != 60 || rej != 1 {
			t.Fatalf("owned %v: tenant a charged %v input, %v output tokens, %v rejections", owned, in, out, rej)
		}
		if st := l.Status(5); len(st.Tenants) != 2 || st.Tenants[0].Input != 300 {
			t.Fatalf("owned %v: status %+v", owned, st)
		}
	}
}

// TestTenantBudgetRefunds: a request that no engine answered gives its
// charge back.
func TestTenantBudgetRefunds(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "bad", http.StatusBadRequest) })
	l, _ := quota.New(quota.Config{Default: quota.Limit{Input: 1e6}})
	_, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), func(c *Config) { c.Quota = l })
	if resp, _ := postTenant(t, srv.URL, "a", chatBody("m", false, strings.Repeat("x", 4000))); resp.StatusCode != 400 {
		t.Fatal(resp.StatusCode)
	}
	if st := l.Status(1); len(st.Tenants) != 1 || st.Tenants[0].Input != 0 {
		t.Fatalf("a refused request stays charged: %+v", st)
	}
}

// TestTenantChargeReadsEveryAPIsUsage: a Responses or Anthropic
// Messages answer's usage (input_tokens, output_tokens, Anthropic's
// cache_read_input_tokens on top of its input_tokens) corrects the
// charge as a chat completion's does, streamed or whole.
func TestTenantChargeReadsEveryAPIsUsage(t *testing.T) {
	const (
		responsesBody   = `{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":64},"output_tokens":9}}`
		responsesStream = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"usage\":null}}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":120,\"output_tokens\":9}}}\n\n"
		messagesBody   = `{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":56,"cache_read_input_tokens":64,"output_tokens":9}}`
		messagesStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":56,\"cache_read_input_tokens\":64,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	)
	for _, tc := range []struct {
		path, req, answer string
	}{
		{"/v1/responses", `{"model":"m","input":"hello"}`, responsesBody},
		{"/v1/responses", `{"model":"m","input":"hello","stream":true}`, responsesStream},
		{"/v1/messages", `{"model":"m","max_tokens":500,"messages":[{"role":"user","content":"hello"}]}`, messagesBody},
		{"/v1/messages", `{"model":"m","max_tokens":500,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, messagesStream},
	} {
		rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(tc.answer, "event:") {
				w.Header().Set("Content-Type", "text/event-stream")
			} else {
				w.Header().Set("Content-Type", "application/json")
			}
			_, _ = io.WriteString(w, tc.answer)
		})
		l, _ := quota.New(quota.Config{Default: quota.Limit{Input: 1e6, Output: 1e6}})
		_, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), func(c *Config) { c.Quota = l })
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.req))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Kvmesh-Tenant", "a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if b := readAll(t, resp); resp.StatusCode != 200 || b != tc.answer {
			t.Fatalf("%s %s: %d %q", tc.path, tc.req, resp.StatusCode, b)
		}
		waitFor(t, "the charge settled", func() bool {
			st := l.Status(1)
			return len(st.Tenants) == 1 && st.Tenants[0].Output == 9
		})
		if st := l.Status(1); st.Tenants[0].Input != 120 {
			t.Errorf("%s %s: charged %+v, want 120 input and 9 output tokens", tc.path, tc.req, st.Tenants[0])
		}
	}
}
