package proxy

import (
	"context"
	"encoding/json"
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
