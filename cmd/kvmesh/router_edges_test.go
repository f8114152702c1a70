package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/kvmesh/kvmesh/summary"
	"go.uber.org/goleak"
)

func edgeBase(logs io.Writer) routerConfig {
	return routerConfig{
		region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Info, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 50 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
	}
}

// slowReplica streams one chunk, then waits for release before the rest
// and [DONE].
func slowReplica(release <-chan struct{}) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m"}]}`)
		case "/v1/chat/completions":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first \"}}]}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"last\"}}]}\n\ndata: [DONE]\n\n")
		default:
			http.NotFound(w, r)
		}
	}))
}

// TestShutdownLeavesThenDrains is issue 8 item 9: on SIGTERM the router
// first leaves the mesh (a peer stops routing to its replicas) while its
// API still accepts, then /readyz says 503, then it stops accepting and
// drains: a stream in flight ends with [DONE].
func TestShutdownLeavesThenDrains(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	release := make(chan struct{})
	rep := slowReplica(release)
	defer rep.Close()
	logs := &lockedWriter{}
	ca := edgeBase(logs)
	ca.name, ca.replicas = "a", []string{rep.URL}
	a, err := startRouter(context.Background(), ca)
	if err != nil {
		t.Fatal(err)
	}
	cb := edgeBase(logs)
	cb.name, cb.join = "b", []string{a.mesh.GossipAddr()}
	b, err := startRouter(context.Background(), cb)
	if err != nil {
		a.shutdown()
		t.Fatal(err)
	}
	defer func() {
		if err := b.shutdown(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	eventually(t, "b to route to a's replica", func() bool { return len(b.mesh.Candidates("m", nil)) == 1 })

	resp, err := client.Post(a.api+"/v1/chat/completions", "application/json", strings.NewReader(chatRequest("hello")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "first") {
		t.Fatalf("first chunk %q: %v", line, err)
	}

	var hookErr []string
	hooked := make(chan struct{})
	a.beforeStopAccepting = func() {
		defer close(hooked)
		// The peer has stopped routing here...
		for i := 0; len(b.mesh.Candidates("m", nil)) != 0; i++ {
			if i == 1000 {
				hookErr = append(hookErr, "b still routes to a's replica after a left")
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		// ...but a request that still reaches this router is served by
		// its own replica during the drain...
		if n := len(a.mesh.Candidates("m", nil)); n != 1 {
			hookErr = append(hookErr, fmt.Sprintf("a has %d candidates after leaving", n))
		}
		// ...while this router still accepts, and says it is not ready.
		if r, err := client.Get(a.api + "/readyz"); err != nil || r.StatusCode != 503 {
			hookErr = append(hookErr, fmt.Sprintf("/readyz while leaving: %v %v", r, err))
		} else {
			r.Body.Close()
		}
	}
	done := make(chan error, 1)
	go func() { done <- a.shutdown() }()
	<-hooked
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream cut by shutdown: %q %v", rest, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	for _, e := range hookErr {
		t.Error(e)
	}
	if _, err := client.Get(a.api + "/healthz"); err == nil {
		t.Error("a still accepts after shutdown")
	}
}

// TestListenerErrorStopsRouter is issue 8 item 9's last part: a failing
// listener stops the router at once, with the listener named.
func TestListenerErrorStopsRouter(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg := edgeBase(io.Discard)
	cfg.name = "a"
	r, err := startRouter(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.ln.Close() // the listener fails under the server
	done := make(chan error, 1)
	go func() { done <- r.run(context.Background(), nil) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "API listener on") {
			t.Fatalf("run returned %v", err)
		}
	case <-time.After(30 * time.Second):
		r.shutdown()
		t.Fatal("the router kept running without its listener")
	}
}

// testPKI is a throwaway CA and a certificate for 127.0.0.1 it signed
// (server and client use), written as PEM files.
type testPKI struct{ ca, cert, key string }

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvmesh test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "router"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p := testPKI{ca: filepath.Join(dir, "ca.pem"), cert: filepath.Join(dir, "cert.pem"), key: filepath.Join(dir, "key.pem")}
	for path, blk := range map[string]*pem.Block{p.ca: {Type: "CERTIFICATE", Bytes: caDER}, p.cert: {Type: "CERTIFICATE", Bytes: der}, p.key: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// TestTLSAuthAdminSplit is issue 8 item 10: the API serves TLS and wants
// a bearer key; a request at the router without replicas is forwarded
// to the owner over TLS (mutual, verified by the peer CA); /metrics and
// /debug/mesh answer only on the admin address.
func TestTLSAuthAdminSplit(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pki := newTestPKI(t)
	keyFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keyFile, []byte("sk-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var hits sync.Map
	rep := e2eReplica("r1", &hits)
	defer rep.Close()
	logs := &lockedWriter{}
	secure := func(name string) routerConfig {
		c := edgeBase(logs)
		c.name, c.adminListen = name, "127.0.0.1:0"
		c.tlsCert, c.tlsKey, c.peerTLSCA, c.peerCert, c.peerKey = pki.cert, pki.key, pki.ca, pki.cert, pki.key
		c.apiKeyFile, c.gossipKey = keyFile, []byte("0123456789abcdef")
		return c
	}
	ca := secure("a")
	ca.replicas = []string{rep.URL}
	a, err := startRouter(context.Background(), ca)
	if err != nil {
		t.Fatal(err)
	}
	cb := secure("b")
	cb.join = []string{a.mesh.GossipAddr()}
	b, err := startRouter(context.Background(), cb)
	if err != nil {
		a.shutdown()
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
	if !strings.HasPrefix(a.api, "https://") {
		t.Fatalf("a advertises %s", a.api)
	}
	pool, _ := readCAPool(pki.ca)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	eventually(t, "b to route to a's replica", func() bool { return len(b.mesh.Candidates("m", nil)) == 1 })

	call := func(base, method, path, key string) (int, string) {
		t.Helper()
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(chatRequest("hello over TLS"))
		}
		req, _ := http.NewRequest(method, base+path, body)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		bb, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(bb)
	}
	bAPI := b.api
	if code, body := call(bAPI, http.MethodPost, "/v1/chat/completions", "sk-test"); code != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("chat through b over TLS: %d %s", code, body)
	}
	if n, ok := hits.Load("r1"); !ok || *n.(*int) != 1 {
		t.Errorf("replica hits %v", n)
	}
	if got := counter(t, a, "kvmesh_rejected_requests_total", ""); got != 0 {
		t.Errorf("a rejected %v requests (the hop should verify)", got)
	}
	if code, _ := call(bAPI, http.MethodPost, "/v1/chat/completions", ""); code != 401 {
		t.Errorf("no key: %d", code)
	}
	if code, _ := call(bAPI, http.MethodGet, "/v1/models", "sk-wrong"); code != 401 {
		t.Errorf("wrong key: %d", code)
	}
	for _, path := range []string{"/metrics", "/debug/mesh"} {
		if code, _ := call(bAPI, http.MethodGet, path, "sk-test"); code != 404 {
			t.Errorf("API %s: %d, want 404", path, code)
		}
		if code, _ := call("http://"+b.adminLn.Addr().String(), http.MethodGet, path, ""); code != 200 {
			t.Errorf("admin %s: %d", path, code)
		}
	}
	// Plain HTTP to the TLS API gets no answer it could mistake for one.
	if resp, err := http.Get("http://" + strings.TrimPrefix(bAPI, "https://") + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP served by the TLS API")
		}
	}
}

func TestEdgeFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	c, err := parseRouterFlags([]string{"--name", "r"}, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.adminListen != "127.0.0.1:9090" || c.maxConns != proxy.DefaultMaxConns || c.maxInflightPerClient != proxy.DefaultMaxInflightPerClient ||
		c.bodyTimeout != proxy.DefaultBodyTimeout || c.drainTimeout != 60*time.Second || c.retryBudget != proxy.DefaultRetryBudget ||
		c.maxAttempts != 3 || c.gossipStreams != (mesh.StreamLimits{MaxStreams: mesh.DefaultMaxStreams, BudgetBytes: mesh.DefaultStreamBytes}) ||
		c.gcHeadroom != defaultGCHeadroom || c.gogcSet || c.clientSendBuffer != proxy.DefaultClientSendBuffer ||
		c.upstreamRecvBuffer != upstream.DefaultUpstreamRecvBuffer {
		t.Errorf("defaults: %+v", c)
	}
	// 0 is the kernel's default; the environment sets it like any flag.
	env := func(k string) (string, bool) {
		if k == "KVMESH_CLIENT_SEND_BUFFER" || k == "KVMESH_UPSTREAM_RECV_BUFFER" {
			return "0", true
		}
		return "", false
	}
	if c, err := parseRouterFlags([]string{"--name", "r"}, env, io.Discard); err != nil || c.clientSendBuffer != 0 || c.upstreamRecvBuffer != 0 {
		t.Errorf("KVMESH_CLIENT_SEND_BUFFER=0, KVMESH_UPSTREAM_RECV_BUFFER=0: %v, %d, %d", err, c.clientSendBuffer, c.upstreamRecvBuffer)
	}
	if c, err := parseRouterFlags([]string{"--name", "r", "--upstream-recv-buffer", "65536"}, none, io.Discard); err != nil || c.upstreamRecvBuffer != 64<<10 {
		t.Errorf("--upstream-recv-buffer 65536: %v, %d", err, c.upstreamRecvBuffer)
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--tls-cert", "x"}, "go together"},
		{[]string{"--peer-tls-key", "x"}, "go together"},
		{[]string{"--drain-timeout", "0s"}, "drain-timeout"},
		{[]string{"--max-attempts", "0"}, "max-attempts"},
		{[]string{"--gossip-stream-budget", "10"}, "gossip-stream-budget"},
		{[]string{"--gc-headroom", "-1"}, "gc-headroom"},
		{[]string{"--client-send-buffer", "-1"}, "client-send-buffer"},
		{[]string{"--client-send-buffer", "1024"}, "client-send-buffer"},
		{[]string{"--upstream-recv-buffer", "-1"}, "upstream-recv-buffer"},
		{[]string{"--upstream-recv-buffer", "1024"}, "upstream-recv-buffer"},
		{[]string{"--upstream-recv-buffer", "134217728"}, "upstream-recv-buffer"},
	} {
		if _, err := parseRouterFlags(append([]string{"--name", "r"}, tc.args...), none, io.Discard); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.wantErr)
		}
	}
	// An operator's GOGC wins over the router's pacing.
	gogc := func(k string) (string, bool) {
		if k == "GOGC" {
			return "200", true
		}
		return "", false
	}
	if c, err := parseRouterFlags([]string{"--name", "r"}, gogc, io.Discard); err != nil || !c.gogcSet {
		t.Errorf("GOGC in the environment not seen: %v, %+v", err, c.gogcSet)
	}
}

// TestReadyzNeedsAHealthyReplica is issue 8 item 7 at the router: while
// its only replica is down /readyz is 503 and a chat request gets 503
// with Retry-After (not 404 model_not_found); once the replica is healthy
// both are served, and an unknown model is a 404.
func TestReadyzNeedsAHealthyReplica(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var up sync.Map
	var hits sync.Map
	healthy := e2eReplica("r1", &hits)
	defer healthy.Close()
	rep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := up.Load("up"); !ok {
			http.Error(w, "starting", http.StatusInternalServerError)
			return
		}
		healthy.Config.Handler.ServeHTTP(w, r)
	}))
	defer rep.Close()
	cfg := edgeBase(io.Discard)
	cfg.name, cfg.replicas = "a", []string{rep.URL}
	a, err := startRouter(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.shutdown()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	status := func(method, path, body string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest(method, a.api+path, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	eventually(t, "a first health round", a.health.Ready)
	if code, _, _ := status(http.MethodGet, "/readyz", ""); code != 503 {
		t.Errorf("/readyz with the replica down: %d", code)
	}
	if code, h, body := status(http.MethodPost, "/v1/chat/completions", chatRequest("hi")); code != 503 || h.Get("Retry-After") == "" {
		t.Errorf("chat with the replica down: %d %q %s", code, h.Get("Retry-After"), body)
	}
	up.Store("up", true)
	eventually(t, "/readyz 200", func() bool { c, _, _ := status(http.MethodGet, "/readyz", ""); return c == 200 })
	if code, _, body := status(http.MethodPost, "/v1/chat/completions", chatRequest("hi")); code != 200 {
		t.Errorf("chat with the replica up: %d %s", code, body)
	}
	unknown := strings.Replace(chatRequest("hi"), `"model":"m"`, `"model":"nope"`, 1)
	if code, _, body := status(http.MethodPost, "/v1/chat/completions", unknown); code != 404 || !strings.Contains(body, "model_not_found") {
		t.Errorf("unknown model: %d %s", code, body)
	}
	if code, _, body := status(http.MethodGet, "/v2/whatever", ""); code != 404 || strings.Contains(body, "model_not_found") {
		t.Errorf("unknown path: %d %s", code, body)
	}
}
