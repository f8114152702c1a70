package main

import (
	"context"
	"encoding/base64"
	"errors"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// testGossipKey is the gossip key of the in-process meshes of these
// tests: a mesh of several routers authenticates its hops with it.
var testGossipKey = []byte("0123456789abcdef")

// TestMeshAuthFlags is issue 24's start rule: a router that joins others
// needs a gossip key, peer mutual TLS, or --insecure-mesh said aloud; a
// router alone needs none.
func TestMeshAuthFlags(t *testing.T) {
	keyFile := writeFile(t, "MDEyMzQ1Njc4OWFiY2RlZg==\n")
	base := []string{"--name", "r1", "--replica", "http://127.0.0.1:8000"}
	join := append([]string{"--join", "127.0.0.1:7946"}, base...)
	mtls := []string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--peer-tls-ca", "ca.pem", "--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem"}
	tests := []struct {
		name         string
		args         []string
		env          map[string]string
		refused      bool
		insecureHops bool // what the proxy is told (startRouter's InsecureHops)
	}{
		{name: "alone, no key", args: base},
		{name: "join, no key, no peer TLS", args: join, refused: true},
		{name: "join with seeds from the environment, no key", args: base, env: map[string]string{"KVMESH_JOIN": "a:1,b:2"}, refused: true},
		{name: "join, gossip key", args: append([]string{"--gossip-key-file", keyFile}, join...)},
		{name: "join, gossip key from the environment", args: join, env: map[string]string{"KVMESH_GOSSIP_KEY_FILE": keyFile}},
		{name: "join, peer mutual TLS", args: append(mtls, join...)},
		{name: "join, TLS without a peer certificate", args: append(slices.Clone(mtls[:6]), join...), refused: true},
		{name: "join, --insecure-mesh", args: append([]string{"--insecure-mesh"}, join...), insecureHops: true},
		{name: "join, KVMESH_INSECURE_MESH", args: join, env: map[string]string{"KVMESH_INSECURE_MESH": "true"}, insecureHops: true},
		{name: "--insecure-mesh with a key: hops still need the MAC", args: append([]string{"--insecure-mesh", "--gossip-key-file", keyFile}, join...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			c, err := parseRouterFlags(tc.args, getenv, io.Discard)
			if tc.refused {
				if !errors.Is(err, errInsecureMesh) {
					t.Fatalf("error %v, want the insecure mesh refusal", err)
				}
				for _, s := range []string{"--gossip-key-file", "--insecure-mesh", "KVMESH_INSECURE_MESH", "--peer-tls-ca"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("refusal does not say %s: %v", s, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.insecureMesh && !meshAuthenticated(&c); got != tc.insecureHops {
				t.Errorf("insecure hops %v, want %v", got, tc.insecureHops)
			}
		})
	}
}

// TestRouterRefusesInsecureMesh: `kvmesh router --join SEED` without a
// key or the opt-out does not start (nothing listens), and says what to
// set.
func TestRouterRefusesInsecureMesh(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, k := range []string{"KVMESH_GOSSIP_KEY_FILE", "KVMESH_INSECURE_MESH", "KVMESH_PEER_TLS_CA", "KVMESH_TLS_CERT", "KVMESH_PEER_TLS_CERT"} {
		t.Setenv(k, "") // set but empty is a flag's empty value; Setenv restores the caller's
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stderr lockedWriter
	err := runRouter(ctx, []string{"--name", "r2", "--listen", "127.0.0.1:0", "--gossip-bind", "127.0.0.1:0", "--admin-listen", "",
		"--join", "127.0.0.1:1", "--replica", "http://127.0.0.1:1"}, io.Discard, &stderr)
	if !errors.Is(err, errInsecureMesh) {
		t.Fatalf("router started or failed otherwise: %v\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), "router serving") {
		t.Errorf("the router served before refusing:\n%s", stderr.String())
	}
}

// namedReplica is an OpenAI replica that names itself in X-Test-Replica
// and counts the hint headers that reach it (none should).
func namedReplica(name string, leaked *int, mu *sync.Mutex) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"m"}]}`)
		case "/v1/chat/completions":
			_, _ = io.Copy(io.Discard, r.Body)
			for _, k := range []string{hop.HeaderHop, hop.HeaderReplica, hop.HeaderMatch, hop.HeaderHopMAC} {
				if r.Header.Get(k) != "" {
					mu.Lock()
					*leaked++
					mu.Unlock()
				}
			}
			w.Header().Set("X-Test-Replica", name)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`)
		default:
			http.NotFound(w, r)
		}
	}))
}

// TestForgedHopHeadersMoveNothing is issue 24's report end to end: one
// router, two replicas, and a client that sends the routers' hint
// headers naming the replica the router would not choose. Forty such
// requests move none, whether the router has no key
// (alone) or has one and the client sends no MAC or a forged one. The
// control, the same router told --insecure-mesh, moves all forty.
func TestForgedHopHeadersMoveNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const n = 40
	forgedMAC := func(h http.Header) {
		h.Set(hop.HeaderHopTime, strconv.FormatInt(time.Now().Unix(), 10))
		h.Set(hop.HeaderHopMAC, base64.RawStdEncoding.EncodeToString([]byte(strings.Repeat("k", 32))))
	}
	tests := []struct {
		name      string
		key       []byte
		insecure  bool
		forge     func(http.Header)
		wantMoved int
	}{
		{name: "no key (a router alone)"},
		{name: "no key, forged MAC", forge: forgedMAC},
		{name: "key, no MAC", key: testGossipKey},
		{name: "key, forged MAC", key: testGossipKey, forge: forgedMAC},
		{name: "control: --insecure-mesh", insecure: true, wantMoved: n},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			leaked := 0
			reps := map[string]*httptest.Server{"s1": namedReplica("s1", &leaked, &mu), "s2": namedReplica("s2", &leaked, &mu)}
			defer reps["s1"].Close()
			defer reps["s2"].Close()
			logs := &lockedWriter{}
			cfg := edgeBase(logs)
			cfg.name, cfg.replicas, cfg.gossipKey, cfg.insecureMesh = "a", []string{reps["s1"].URL, reps["s2"].URL}, tc.key, tc.insecure
			r, err := startRouter(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := r.shutdown(); err != nil {
					t.Error(err)
				}
				if t.Failed() {
					t.Log(logs.String())
				}
			}()
			eventually(t, "both replicas healthy", func() bool {
				return hasCandidate(r, "m", reps["s1"].URL) && hasCandidate(r, "m", reps["s2"].URL)
			})
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			prompt := chatRequest(strings.Repeat("The prompt every request shares, so its prefix is at one replica. ", 20))
			send := func(forge func(http.Header)) string {
				t.Helper()
				req, err := http.NewRequest(http.MethodPost, r.api+"/v1/chat/completions", strings.NewReader(prompt))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				if forge != nil {
					forge(req.Header)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, body)
				}
				return resp.Header.Get("X-Test-Replica")
			}
			// Where the prefix lives: the replica the router chooses for it.
			home := send(nil)
			other := "s1"
			if home == "s1" {
				other = "s2"
			}
			moved := 0
			for range n {
				got := send(func(h http.Header) {
					h.Set(hop.HeaderHop, "1")
					h.Set(hop.HeaderReplica, reps[other].URL)
					h.Set(hop.HeaderMatch, "1000")
					if tc.forge != nil {
						tc.forge(h)
					}
				})
				if got == other {
					moved++
				}
			}
			t.Logf("%s: %d of %d forged requests went to the replica their headers named", tc.name, moved, n)
			if moved != tc.wantMoved {
				t.Errorf("%d of %d forged requests moved to %s, want %d", moved, n, other, tc.wantMoved)
			}
			mu.Lock()
			if leaked != 0 {
				t.Errorf("hint headers reached a replica %d times", leaked)
			}
			mu.Unlock()
			if tc.wantMoved == 0 {
				if got := counter(t, r, "kvmesh_hop_headers_ignored_total", ""); got != n {
					t.Errorf("kvmesh_hop_headers_ignored_total %v, want %d", got, n)
				}
			}
		})
	}
}

// TestTempGossipKey: the demo's key file is one readGossipKey reads, a
// fresh key each time, readable by this user only.
func TestTempGossipKey(t *testing.T) {
	var keys [][]byte
	for range 2 {
		path, err := tempGossipKey()
		if err != nil {
			t.Fatal(err)
		}
		defer os.Remove(path)
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", path, st, err)
		}
		key, err := readGossipKey(path)
		if err != nil || len(key) != 32 {
			t.Fatalf("%x %v", key, err)
		}
		keys = append(keys, key)
	}
	if string(keys[0]) == string(keys[1]) {
		t.Error("the same key twice")
	}
}

// TestHopsBetweenRouters: the hops of a mesh reach their owner as hops
// (their hints believed, none ignored), whether the mesh authenticates
// them with the gossip key or was told --insecure-mesh. The control: an
// owner with neither (a keyless first router that others joined with
// --insecure-mesh) ignores every hop's hints and routes it itself.
func TestHopsBetweenRouters(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const n = 5
	for _, tc := range []struct {
		name          string
		key           []byte
		insecure      bool // both routers
		ownerInsecure bool // the owner too
		wantIgnored   float64
	}{
		{name: "gossip key", key: testGossipKey},
		{name: "--insecure-mesh, no key", insecure: true, ownerInsecure: true},
		{name: "control: the owner has neither", insecure: true, wantIgnored: n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			leaked := 0
			rep := namedReplica("s1", &leaked, &mu)
			defer rep.Close()
			logs := &lockedWriter{}
			ca := edgeBase(logs)
			ca.name, ca.replicas, ca.gossipKey, ca.insecureMesh = "a", []string{rep.URL}, tc.key, tc.ownerInsecure
			a, err := startRouter(context.Background(), ca)
			if err != nil {
				t.Fatal(err)
			}
			cb := edgeBase(logs)
			cb.name, cb.join, cb.gossipKey, cb.insecureMesh = "b", []string{a.mesh.GossipAddr()}, tc.key, tc.insecure
			b, err := startRouter(context.Background(), cb)
			if err != nil {
				_ = a.shutdown()
				t.Fatal(err)
			}
			defer func() {
				for _, r := range []*router{b, a} {
					if err := r.shutdown(); err != nil {
						t.Error(err)
					}
				}
				if t.Failed() {
					t.Log(logs.String())
				}
			}()
			eventually(t, "b to route to a's replica", func() bool { return hasCandidate(b, "m", rep.URL) })
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			for i := range n {
				resp, err := client.Post(b.api+"/v1/chat/completions", "application/json", strings.NewReader(chatRequest("hop "+strconv.Itoa(i))))
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Test-Replica") != "s1" {
					t.Fatalf("status %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Test-Replica"), body)
				}
			}
			if got := counter(t, a, "kvmesh_hop_headers_ignored_total", ""); got != tc.wantIgnored {
				t.Errorf("the owner ignored the hints of %v hops, want %v", got, tc.wantIgnored)
			}
			mu.Lock()
			defer mu.Unlock()
			if leaked != 0 {
				t.Errorf("hint headers reached the replica %d times", leaked)
			}
		})
	}
}
