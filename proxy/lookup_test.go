package proxy

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStoredResponseFoundAtAPeer: a Responses turn naming a response
// another router relayed reaches the replica that stored it (the summaries
// point elsewhere), by asking the peers once; retrieving it by id does
// too. A peer that cannot prove it is one learns nothing.
func TestStoredResponseFoundAtAPeer(t *testing.T) {
	key := hop.Key([]byte("0123456789abcdef0123456789abcdef"))
	for _, tc := range []struct {
		name           string
		askerKey       []byte
		found          bool
		wantLookupCode int // a stranger's lookup at the peer
	}{
		{"shared hop key", key, true, http.StatusForbidden},
		{"wrong hop key", hop.Key([]byte("another key, another mesh......")), false, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n atomic.Int64
			a := newReplica(t, respondsAs("a", &n))
			b := newReplica(t, respondsAs("b", &n))
			// The router that relayed turn 1 (to a).
			first, firstSrv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: a.URL}), func(c *Config) { c.HopKey = key })
			turn1 := answer(t, firstSrv.URL, "/v1/responses", fmt.Sprintf(`{"model":"m","input":%q}`, longPrompt), nil)
			id, ok := findID([]byte(turn1))
			if !ok || replicaIn(turn1, "a") != "a" {
				t.Fatalf("turn 1: %s", turn1)
			}
			// The router turn 2 arrives at: b's summary claims everything.
			view := newFakeView([]string{"m"}, fakeReplica{id: a.URL}, fakeReplica{id: b.URL, match: 100})
			p, srv, _ := newTestProxy(t, view, func(c *Config) {
				c.HopKey = tc.askerKey
				c.Peers = func() []string { return []string{deadAddr(t), firstSrv.URL} }
			})
			want := "b"
			if tc.found {
				want = "a"
			}
			for range 2 {
				// A long input: without the id, b's summary decides.
				next := answer(t, srv.URL, "/v1/responses", fmt.Sprintf(`{"model":"m","input":%q,"previous_response_id":%q}`, longPrompt, id), nil)
				if got := replicaIn(next, "a", "b"); got != want {
					t.Fatalf("turn 2 went to %q, want %q: %s", got, want, next)
				}
			}
			found := testutil.ToFloat64(p.lookups.results.WithLabelValues(lookupFound))
			missing := testutil.ToFloat64(p.lookups.results.WithLabelValues(lookupMissing))
			switch {
			case tc.found && (found != 1 || missing != 0):
				t.Errorf("lookups found %v, missing %v; want one found (the answer is remembered)", found, missing)
			case !tc.found && (found != 0 || missing != 2):
				t.Errorf("lookups found %v, missing %v; want two missing", found, missing)
			}
			if tc.found {
				resp, err := http.Get(srv.URL + "/v1/responses/" + id)
				if err != nil {
					t.Fatal(err)
				}
				if body := readAll(t, resp); resp.StatusCode != 200 || replicaIn(body, "a", "b") != "a" {
					t.Errorf("GET by id: %d %s", resp.StatusCode, body)
				}
			}
			// A client asking the peer directly, without the mesh's key.
			resp, err := http.Get(firstSrv.URL + LookupPath + "?id=" + id)
			if err != nil {
				t.Fatal(err)
			}
			if body := readAll(t, resp); resp.StatusCode != tc.wantLookupCode || strings.Contains(body, a.URL) {
				t.Errorf("unauthenticated lookup: %d %s", resp.StatusCode, body)
			}
			if first.responses.len() != 1 {
				t.Errorf("the first router remembers %d ids", first.responses.len())
			}
		})
	}
}

// TestStoredResponseByIDNeedsAPIKey: retrieving a stored response is an
// API call like any other: without a key it is refused, with one it is
// served.
func TestStoredResponseByIDNeedsAPIKey(t *testing.T) {
	var n atomic.Int64
	a := newReplica(t, respondsAs("a", &n))
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("sk-one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := LoadKeySet(file)
	if err != nil {
		t.Fatal(err)
	}
	p, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: a.URL}), func(c *Config) { c.APIKeys = keys })
	p.responses.add("resp_x", a.URL)
	for _, tc := range []struct {
		key  string
		code int
	}{{"", 401}, {"sk-wrong", 401}, {"sk-one", 200}} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/responses/resp_x", nil)
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != tc.code {
			t.Errorf("key %q: %d %s", tc.key, resp.StatusCode, body)
		}
	}
}
