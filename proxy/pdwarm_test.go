package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/proxy/disagg"
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
)

// TestPDWarm: once a split request's answer is complete, the replica
// that prefilled it gets the prompt and the answer as a one-token plain
// request (vLLM's form), under the client's request id with "-warm", and
// is recorded as holding the answer's blocks too; a prefill replica that
// could not start it at once is skipped; with PDWarm off nothing is sent.
func TestPDWarm(t *testing.T) {
	for _, tc := range []struct {
		name            string
		warm            bool
		slots, inFlight int
		want            string // the warm outcome counted ("": none)
	}{
		{"sent", true, 0, 0, warmOK},
		{"busy", true, 1, 1, warmBusy},
		{"off", false, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var warms []map[string]json.RawMessage
			var warmIDs []string
			pre := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				m, b := legBody(t, r)
				if len(m["kv_transfer_params"]) > 0 {
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":0}},` +
						`"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p","remote_block_ids":[1],"remote_host":"h","remote_port":1}}`))
					return
				}
				mu.Lock()
				warms, warmIDs = append(warms, m), append(warmIDs, r.Header.Get(HeaderRequestID))
				mu.Unlock()
				if string(m["max_tokens"]) != "1" || string(m["stream"]) != "false" || string(m["add_generation_prompt"]) != "false" {
					t.Errorf("warm body %s", b)
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"y"}}],"usage":{"prompt_tokens":110,"prompt_tokens_details":{"cached_tokens":96}}}`))
			})
			dec := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				sseChat(w, []string{strings.Repeat("decoded ", 40), "answer"}, 0)
			})
			view := newFakeView([]string{"m"},
				fakeReplica{id: pre.URL, role: route.RolePrefill, slots: tc.slots, inFlight: tc.inFlight},
				fakeReplica{id: dec.URL, role: route.RoleDecode})
			p, srv, reg := newTestProxy(t, view, func(c *Config) { c.PD, c.PDWarm = disagg.VLLM, tc.warm })
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/v1/chat/completions",
				strings.NewReader(chatBody("m", true, strings.Repeat("a long prompt ", 20))))
			req.Header.Set(HeaderRequestID, "r1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if body := readAll(t, resp); !strings.Contains(body, "[DONE]") {
				t.Fatalf("client got %q", body)
			}
			if tc.want != "" {
				waitFor(t, "the warm outcome", func() bool { return metricOf(t, reg, "kvmesh_pd_warm_requests_total", tc.want, "vllm") == 1 })
			}
			p.Close() // ends the warm requests
			mu.Lock()
			defer mu.Unlock()
			if tc.want != warmOK {
				if len(warms) != 0 {
					t.Fatalf("%d warm requests sent", len(warms))
				}
				return
			}
			if len(warms) != 1 || warmIDs[0] != "r1-warm" {
				t.Fatalf("warm requests %d, ids %v", len(warms), warmIDs)
			}
			var msgs []map[string]string
			if err := json.Unmarshal(warms[0]["messages"], &msgs); err != nil || len(msgs) != 2 ||
				msgs[1]["role"] != "assistant" || msgs[1]["content"] != strings.Repeat("decoded ", 40)+"answer" {
				t.Errorf("warm messages %s", warms[0]["messages"])
			}
			// Recorded: the prompt (its prefill leg), then the prompt
			// and the answer (the warm).
			recs := view.recorded(pre.URL)
			if len(recs) < 2 || len(recs[len(recs)-1]) <= len(recs[0]) {
				lens := []int{}
				for _, r := range recs {
					lens = append(lens, len(r))
				}
				t.Errorf("the prefill replica recorded blocks %v, want the answer's after the prompt's", lens)
			}
		})
	}
}

// The warm requests in flight are bounded in number and in the bytes
// they hold together; what one gives back another may take.
func TestWarmerBounds(t *testing.T) {
	sent := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "warms"}, []string{"protocol", "outcome"})
	w := newWarmer(sent, 100)
	defer w.close()
	if !w.take(60) {
		t.Fatal("60 of 100 bytes refused")
	}
	if w.take(60) {
		t.Fatal("120 of 100 bytes taken")
	}
	w.give(60)
	if !w.take(100) {
		t.Fatal("100 of 100 bytes refused after the first gave its 60 back")
	}
	w.give(100)
	for i := range maxWarms {
		if !w.take(0) {
			t.Fatalf("place %d of %d refused", i+1, maxWarms)
		}
	}
	if w.take(0) {
		t.Fatalf("place %d of %d taken", maxWarms+1, maxWarms)
	}
}
