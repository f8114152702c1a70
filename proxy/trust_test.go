package proxy

import (
	"encoding/base64"
	"fmt"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestForgedHintsMoveNothing is issue 24's "secure by default": a client
// that sends a router's hint headers (X-Kvmesh-Hop, X-Kvmesh-Replica,
// X-Kvmesh-Match) naming the replica it wants does not move its request
// there unless a peer provably sent them. Forty requests whose prefix
// replica a holds all name replica b; every one must still reach a, and
// no hint header may reach a replica. The last two cases are the
// controls that make the test able to fail: hints the router is told to
// believe (--insecure-mesh) or that carry a peer's MAC move all forty.
func TestForgedHintsMoveNothing(t *testing.T) {
	const n = 40
	otherKey := hop.Key([]byte("fedcba9876543210"))
	tests := []struct {
		name       string
		cfg        func(*Config)
		sign       func(req *http.Request, replica string)
		wantMoved  int
		wantReason string // the kvmesh_hop_headers_ignored_total reason counted n times
	}{
		{name: "no key, no peer TLS (a single router)", wantReason: ignoreNoMeshAuth},
		{name: "no key: a MAC proves nothing", sign: func(req *http.Request, replica string) {
			(&hop.Signer{Key: testHopKey, Now: time.Now}).Sign(req, replica, 1000, 0, 0)
		}, wantReason: ignoreNoMeshAuth},
		{name: "key, no MAC", cfg: func(c *Config) { c.HopKey = testHopKey }, wantReason: ignoreBadMAC},
		{name: "key, forged MAC", cfg: func(c *Config) { c.HopKey = testHopKey }, sign: func(req *http.Request, _ string) {
			req.Header.Set(hop.HeaderHopTime, strconv.FormatInt(time.Now().Unix(), 10))
			req.Header.Set(hop.HeaderHopMAC, base64.RawStdEncoding.EncodeToString([]byte(strings.Repeat("x", 32))))
		}, wantReason: ignoreBadMAC},
		{name: "key, MAC under another key", cfg: func(c *Config) { c.HopKey = testHopKey }, sign: func(req *http.Request, replica string) {
			(&hop.Signer{Key: otherKey, Now: time.Now}).Sign(req, replica, 1000, 0, 0)
		}, wantReason: ignoreBadMAC},
		{name: "key, a peer's MAC replayed past the skew", cfg: func(c *Config) { c.HopKey = testHopKey }, sign: func(req *http.Request, replica string) {
			old := func() time.Time { return time.Now().Add(-2 * hop.Skew) }
			(&hop.Signer{Key: testHopKey, Now: old}).Sign(req, replica, 1000, 0, 0)
		}, wantReason: ignoreBadMAC},
		{name: "peer TLS only, no certificate", cfg: func(c *Config) { c.TrustPeerCerts = true }, wantReason: ignoreNoPeerCert},
		{name: "control: --insecure-mesh believes them", cfg: func(c *Config) { c.InsecureHops = true }, wantMoved: n},
		{name: "control: --insecure-mesh with TLS but no peer certificates", cfg: func(c *Config) { c.InsecureHops, c.TrustPeerCerts = true, true }, wantMoved: n},
		{name: "control: a peer's MAC", cfg: func(c *Config) { c.HopKey = testHopKey }, sign: func(req *http.Request, replica string) {
			(&hop.Signer{Key: testHopKey, Now: time.Now}).Sign(req, replica, 1000, 0, 0)
		}, wantMoved: n},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			chat := func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "hi", 0) }
			a, b := newReplica(t, chat), newReplica(t, chat)
			view := newFakeView([]string{"m"}, fakeReplica{id: a.URL, match: 1 << 20}, fakeReplica{id: b.URL})
			p, srv, _ := newTestProxy(t, view, tc.cfg)
			for i := range n {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/chat/completions",
					strings.NewReader(chatBody("m", false, fmt.Sprintf("%s %d", longPrompt, i))))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(hop.HeaderHop, "1")
				req.Header.Set(hop.HeaderReplica, b.URL)
				req.Header.Set(hop.HeaderMatch, "1000")
				if tc.sign != nil {
					tc.sign(req, b.URL)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
				}
			}
			waitCounted(t, p, epChat, n)
			if moved := b.count(); moved != tc.wantMoved || a.count()+moved != n {
				t.Errorf("%d of %d requests went to the replica the headers named (%d to the prefix's), want %d", moved, n, a.count(), tc.wantMoved)
			}
			for _, rs := range []*replicaServer{a, b} {
				rs.mu.Lock()
				for _, h := range rs.headers {
					for _, k := range []string{hop.HeaderHop, hop.HeaderReplica, hop.HeaderMatch, hop.HeaderHopMAC, hop.HeaderHopTime} {
						if h.Get(k) != "" {
							t.Errorf("%s reached a replica", k)
						}
					}
				}
				rs.mu.Unlock()
			}
			for _, reason := range []string{ignoreNoMeshAuth, ignoreBadMAC, ignoreNoPeerCert, ignoreIncomplete} {
				want := 0.0
				if reason == tc.wantReason {
					want = n
				}
				if got := testutil.ToFloat64(p.trust.ignored.WithLabelValues(reason)); got != want {
					t.Errorf("kvmesh_hop_headers_ignored_total{reason=%q} = %v, want %v", reason, got, want)
				}
			}
		})
	}
}

// TestIncompleteHintsIgnored: a replica or match header without
// X-Kvmesh-Hop is never a router's, even where hints are believed.
func TestIncompleteHintsIgnored(t *testing.T) {
	chat := func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "hi", 0) }
	a, b := newReplica(t, chat), newReplica(t, chat)
	view := newFakeView([]string{"m"}, fakeReplica{id: a.URL, match: 1 << 20}, fakeReplica{id: b.URL})
	p, srv, _ := newTestProxy(t, view, func(c *Config) { c.InsecureHops = true })
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", false, longPrompt)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(hop.HeaderReplica, b.URL)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	waitCounted(t, p, epChat, 1)
	if b.count() != 0 || a.count() != 1 {
		t.Errorf("a %d, b %d: want the request at a", a.count(), b.count())
	}
	if got := testutil.ToFloat64(p.trust.ignored.WithLabelValues(ignoreIncomplete)); got != 1 {
		t.Errorf("ignored{incomplete} = %v, want 1", got)
	}
}

// TestLookupNeedsAProvableMesh: a router that cannot authenticate peers
// tells no one which replica holds a response; one told --insecure-mesh
// answers as its hops are served (the client's API key, if any).
func TestLookupNeedsAProvableMesh(t *testing.T) {
	a := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "hi", 0) })
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		want int
	}{
		{"no key, no peer TLS", nil, http.StatusForbidden},
		{"--insecure-mesh", func(c *Config) { c.InsecureHops = true }, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: a.URL}), tc.cfg)
			p.responses.add("resp_x", a.URL)
			resp, err := http.Get(srv.URL + LookupPath + "?id=resp_x")
			if err != nil {
				t.Fatal(err)
			}
			if body := readAll(t, resp); resp.StatusCode != tc.want || (tc.want == http.StatusOK && !strings.Contains(body, a.URL)) {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tc.want, body)
			}
		})
	}
}
